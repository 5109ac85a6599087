#include "CTetherCRC32C.h"

#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#include <pthread.h>

int tether_crc32c_hardware_available(void) {
    unsigned int eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
    return (ecx & bit_SSE4_2) ? 1 : 0;
}

// The crc32 instruction takes three cycles but can start one per cycle, so one stream of
// 8-byte steps runs at a third of its speed. Long buffers are split into three blocks whose
// CRCs are computed interleaved, then combined: the CRC of A then B is the CRC of A shifted
// over len(B) zero bytes, XOR the CRC of B from zero. The shift is a linear operator, applied
// with four table lookups; its tables are built once (the operator by repeated squaring, as
// zlib's crc32_combine does). Block lengths are powers of two, which that construction needs.

enum { TETHER_LONG = 2048, TETHER_SHORT = 256 };

static uint32_t tether_zeros_long[4][256];
static uint32_t tether_zeros_short[4][256];
static pthread_once_t tether_zeros_once = PTHREAD_ONCE_INIT;

// Multiplies the 32x32 bit matrix `matrix` (one column per element) by `vector`, over GF(2).
static uint32_t tether_gf2_times(const uint32_t *matrix, uint32_t vector) {
    uint32_t sum = 0;
    while (vector) {
        if (vector & 1) sum ^= *matrix;
        vector >>= 1;
        matrix += 1;
    }
    return sum;
}

static void tether_gf2_square(uint32_t *square, const uint32_t *matrix) {
    for (int n = 0; n < 32; n++) square[n] = tether_gf2_times(matrix, matrix[n]);
}

// The operator that feeds `length` zero bytes (a power of two) to a CRC-32C register.
static void tether_zeros_operator(uint32_t *even, size_t length) {
    uint32_t odd[32];
    odd[0] = 0x82F63B78;  // one zero bit: the reflected polynomial...
    uint32_t row = 1;
    for (int n = 1; n < 32; n++) {  // ...and a shift
        odd[n] = row;
        row <<= 1;
    }
    tether_gf2_square(even, odd);  // two zero bits
    tether_gf2_square(odd, even);  // four zero bits
    // Each pass doubles: the first puts one zero byte in `even`.
    for (;;) {
        tether_gf2_square(even, odd);
        length >>= 1;
        if (length == 0) return;
        tether_gf2_square(odd, even);
        length >>= 1;
        if (length == 0) break;
    }
    memcpy(even, odd, sizeof(odd));
}

static void tether_zeros_table(uint32_t zeros[4][256], size_t length) {
    uint32_t operator[32];
    tether_zeros_operator(operator, length);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = tether_gf2_times(operator, n);
        zeros[1][n] = tether_gf2_times(operator, n << 8);
        zeros[2][n] = tether_gf2_times(operator, n << 16);
        zeros[3][n] = tether_gf2_times(operator, n << 24);
    }
}

static void tether_zeros_build(void) {
    tether_zeros_table(tether_zeros_long, TETHER_LONG);
    tether_zeros_table(tether_zeros_short, TETHER_SHORT);
}

static inline uint32_t tether_shift(uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xFF] ^ zeros[1][(crc >> 8) & 0xFF] ^ zeros[2][(crc >> 16) & 0xFF] ^ zeros[3][crc >> 24];
}

// Three interleaved streams over `block` bytes each from `pointer` (a multiple of 8), combined.
__attribute__((target("sse4.2")))
static uint64_t tether_three_way(uint64_t crc0, const uint8_t *pointer, size_t block, uint32_t zeros[4][256]) {
    uint64_t crc1 = 0, crc2 = 0;
    const uint8_t *end = pointer + block;
    while (pointer < end) {
        uint64_t a, b, c;
        memcpy(&a, pointer, 8);
        memcpy(&b, pointer + block, 8);
        memcpy(&c, pointer + 2 * block, 8);
        crc0 = _mm_crc32_u64(crc0, a);
        crc1 = _mm_crc32_u64(crc1, b);
        crc2 = _mm_crc32_u64(crc2, c);
        pointer += 8;
    }
    crc0 = tether_shift(zeros, (uint32_t)crc0) ^ (uint32_t)crc1;
    return tether_shift(zeros, (uint32_t)crc0) ^ (uint32_t)crc2;
}

__attribute__((target("sse4.2")))
uint32_t tether_crc32c_hardware_update(uint32_t state, const void *bytes, size_t count) {
    const uint8_t *pointer = (const uint8_t *)bytes;
    while (count > 0 && ((uintptr_t)pointer & 7) != 0) {
        state = _mm_crc32_u8(state, *pointer);
        pointer += 1;
        count -= 1;
    }
    uint64_t wide = state;
    if (count >= 3 * TETHER_SHORT) {
        pthread_once(&tether_zeros_once, tether_zeros_build);
        while (count >= 3 * TETHER_LONG) {
            wide = tether_three_way(wide, pointer, TETHER_LONG, tether_zeros_long);
            pointer += 3 * TETHER_LONG;
            count -= 3 * TETHER_LONG;
        }
        while (count >= 3 * TETHER_SHORT) {
            wide = tether_three_way(wide, pointer, TETHER_SHORT, tether_zeros_short);
            pointer += 3 * TETHER_SHORT;
            count -= 3 * TETHER_SHORT;
        }
    }
    while (count >= 8) {
        uint64_t word;
        memcpy(&word, pointer, 8);
        wide = _mm_crc32_u64(wide, word);
        pointer += 8;
        count -= 8;
    }
    state = (uint32_t)wide;
    while (count > 0) {
        state = _mm_crc32_u8(state, *pointer);
        pointer += 1;
        count -= 1;
    }
    return state;
}

#else

int tether_crc32c_hardware_available(void) { return 0; }

uint32_t tether_crc32c_hardware_update(uint32_t state, const void *bytes, size_t count) {
    (void)bytes;
    (void)count;
    return state;  // never called: not available
}

#endif

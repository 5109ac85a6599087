#include "CTetherCRC32C.h"

#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>

int tether_crc32c_hardware_available(void) {
    unsigned int eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
    return (ecx & bit_SSE4_2) ? 1 : 0;
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

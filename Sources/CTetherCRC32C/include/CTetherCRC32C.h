// CRC-32C with the processor's instruction (SSE 4.2 on x86_64), for TetherCore's `CRC32C`.
// Swift cannot enable a processor feature for one function; C can, so this is the only C in
// Tether. Other architectures get `available() == 0` and use the Swift table.
#ifndef C_TETHER_CRC32C_H
#define C_TETHER_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/// Whether `tether_crc32c_hardware_update` may be called on this processor (1) or not (0).
int tether_crc32c_hardware_available(void);

/// Adds `count` bytes at `bytes` to a CRC-32C state (the running value, before the final XOR)
/// and returns the new state. Call only if `tether_crc32c_hardware_available()` returned 1.
uint32_t tether_crc32c_hardware_update(uint32_t state, const void *bytes, size_t count);

#endif

#ifndef C_LIB_FUZZER_H
#define C_LIB_FUZZER_H

#include <stddef.h>
#include <stdint.h>

/// libFuzzer's driver, for programs that have their own `main` (see libFuzzer's documentation,
/// "Using libFuzzer as a library").
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));

#endif

// Declarations only; libFuzzer itself is linked by -sanitize=fuzzer.
#include "CLibFuzzer.h"

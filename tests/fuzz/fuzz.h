/*
 * fuzz.h - what the libFuzzer targets share: the entry point's declaration and CHECK, which
 * stops the run (a crash libFuzzer reports with its input) when an invariant fails.
 */
#ifndef SPH_FUZZ_H
#define SPH_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#define CHECK(c)                                                                               \
    do {                                                                                       \
        if (!(c)) __builtin_trap();                                                            \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif

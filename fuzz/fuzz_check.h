#pragma once
// A property the fuzzed code must keep: when it does not, print why and abort, which libFuzzer
// reports as a crash and saves the input.
#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, why)                                                          \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, why); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

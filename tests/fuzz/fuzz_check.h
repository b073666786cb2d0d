// What the fuzz targets assert beyond "does not crash": a property that a
// parser's result must have. A broken one aborts, so libFuzzer saves the
// input as a crash like any sanitizer report.
#pragma once

#include <cstdio>
#include <cstdlib>

#define ASYMPO_FUZZ_CHECK(cond)                                                             \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

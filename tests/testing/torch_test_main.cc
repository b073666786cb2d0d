// main() of the test programs that run LibTorch: one intra-op thread per
// process (ASYMPO_TEST_THREADS overrides it). ctest runs many test
// processes at once; with LibTorch's default of one thread per core each,
// a 16-core machine ran 16 x 16 threads and tiny decode steps slowed down
// by two orders of magnitude, enough to time tests out. OpenBLAS's own pool
// is capped too (SetCpuThreads).
#include <algorithm>
#include <cstdlib>

#include <gtest/gtest.h>
#include "common/model/device.h"

int main(int argc, char** argv) {
  int threads = 1;
  if (const char* env = std::getenv("ASYMPO_TEST_THREADS")) threads = std::max(1, std::atoi(env));
  asympo::SetCpuThreads(threads);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

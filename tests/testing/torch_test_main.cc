// main() of the test programs that run LibTorch: one intra-op thread per
// process (ASYMPO_TEST_THREADS overrides it). ctest runs many test
// processes at once; with LibTorch's default of one thread per core each,
// a 16-core machine ran 16 x 16 threads and tiny decode steps slowed down
// by two orders of magnitude, enough to time tests out.
#include <algorithm>
#include <cstdlib>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  int threads = 1;
  if (const char* env = std::getenv("ASYMPO_TEST_THREADS")) threads = std::max(1, std::atoi(env));
  at::set_num_threads(threads);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

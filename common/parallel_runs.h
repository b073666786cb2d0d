// ParallelRuns(n, threads, fn): fn(i) for every i in [0, n), on up to
// `threads` threads (the caller's among them), each taking a contiguous run
// of indices; returns when all have run. For a few large, equal pieces of
// work (checksums and deltas of snapshot buckets): it starts its threads per
// call. fn must be safe to call from several threads at once on different i.
#pragma once

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace asympo {

template <typename Fn>
void ParallelRuns(size_t n, int threads, Fn fn) {
  const size_t workers = std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(threads), n));
  auto run = [&](size_t w) {
    for (size_t i = n * w / workers; i < n * (w + 1) / workers; ++i) fn(i);
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) pool.emplace_back(run, w);
  run(0);
  for (std::thread& t : pool) t.join();
}

}  // namespace asympo

// The benchmark programs' small command-line readers (`--name value`), their
// median and their timer, shared by model_bench, publish_bench and
// task_learning.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace asympo::bench {

inline std::string FlagS(int argc, char** argv, const char* name, const char* def) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return def;
}

inline int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  const std::string v = FlagS(argc, argv, name, "");
  return v.empty() ? def : std::atoll(v.c_str());
}

inline double FlagD(int argc, char** argv, const char* name, double def) {
  const std::string v = FlagS(argc, argv, name, "");
  return v.empty() ? def : std::atof(v.c_str());
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds one call of `fn` takes, `wait` included when given (a GPU
// benchmark passes a device synchronisation, so that the clock stops after
// the work and not after its launch).
inline double SecondsOf(const std::function<void()>& fn, const std::function<void()>& wait = {}) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  if (wait) wait();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The median of `reps` timed calls of `fn` after one untimed warm-up call.
inline double WarmMedianSeconds(const std::function<void()>& fn, int64_t reps,
                                const std::function<void()>& wait = {}) {
  fn();
  if (wait) wait();
  std::vector<double> ts;
  for (int64_t i = 0; i < reps; ++i) ts.push_back(SecondsOf(fn, wait));
  return Median(ts);
}

}  // namespace asympo::bench

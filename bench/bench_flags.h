// The benchmark programs' small command-line readers (`--name value`,
// validated: a bad number or an unknown flag exits 2 with its name), their
// median and their timer, shared by every program in bench/.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace asympo::bench {

// The flag names a program has asked for, so that RejectUnknownFlags can
// tell a misspelt one from a real one.
inline std::vector<std::string>& KnownFlags() {
  static std::vector<std::string> names;
  return names;
}

[[noreturn]] inline void FlagError(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::exit(2);
}

// The value of `--name value`; the last one wins when a flag is repeated (as
// with the daemons' flags), and a flag at the end with no value is an error.
inline std::string FlagS(int argc, char** argv, const char* name, const char* def) {
  KnownFlags().push_back(name);
  const char* value = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], name) != 0) continue;
    if (i + 1 >= argc) FlagError(std::string(name) + " needs a value");
    value = argv[++i];
  }
  return value == nullptr ? def : value;
}

inline int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  const std::string v = FlagS(argc, argv, name, "");
  if (v.empty()) return def;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0') {
    FlagError(std::string(name) + " is '" + v + "'; it must be an integer");
  }
  return x;
}

inline double FlagD(int argc, char** argv, const char* name, double def) {
  const std::string v = FlagS(argc, argv, name, "");
  if (v.empty()) return def;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (errno != 0 || end == v.c_str() || *end != '\0' || !std::isfinite(x)) {
    FlagError(std::string(name) + " is '" + v + "'; it must be a finite number");
  }
  return x;
}

// A comma-separated list of integers (`--sizes 1,2,4`).
inline std::vector<int64_t> ListFlag(int argc, char** argv, const char* name, const char* def) {
  const std::string v = FlagS(argc, argv, name, def);
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= v.size()) {
    const size_t comma = std::min(v.find(',', start), v.size());
    const std::string item = v.substr(start, comma - start);
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || errno != 0 || *end != '\0') {
      FlagError(std::string(name) + " is '" + v + "'; it must be integers separated by commas");
    }
    out.push_back(x);
    start = comma + 1;
  }
  return out;
}

// Call after every flag has been read: exits 2 naming the first argument
// that is not `--known value` (a misspelt flag would otherwise be ignored
// and the run would measure the default).
inline void RejectUnknownFlags(int argc, char** argv) {
  const auto& known = KnownFlags();
  for (int i = 1; i < argc; i += 2) {
    if (std::find(known.begin(), known.end(), argv[i]) != known.end()) continue;
    std::string names;
    for (const auto& k : known) {
      if ((names + " ").find(" " + k + " ") == std::string::npos) names += " " + k;
    }
    FlagError(std::string("unknown argument '") + argv[i] + "'; the flags are" + names);
  }
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

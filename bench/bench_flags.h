// The benchmark programs' small command-line readers (`--name value`) and
// their median, shared by model_bench, publish_bench and task_learning.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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

}  // namespace asympo::bench

#include "common/flag_ranges.h"

#include <cmath>
#include <cstdint>
#include <map>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace asympo {
namespace {

struct Range {
  double lo = 0, hi = 0;  // numbers
  absl::Duration dlo, dhi;
  bool duration = false;
};

std::map<std::string, Range>& Ranges() {
  static auto* ranges = new std::map<std::string, Range>();
  return *ranges;
}

bool IsNumeric(const absl::CommandLineFlag& f) {
  return f.IsOfType<int32_t>() || f.IsOfType<int64_t>() || f.IsOfType<uint32_t>() ||
         f.IsOfType<uint64_t>() || f.IsOfType<double>() || f.IsOfType<float>() ||
         f.IsOfType<absl::Duration>();
}

// Whole numbers in full (1048576, not 1.04858e+06), up to 1e15.
std::string Number(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
  return std::fabs(x) < 1e15 ? absl::StrCat(x) : absl::StrFormat("%.17g", x);
}

std::string Text(const Range& r) {
  return r.duration ? absl::StrCat(absl::FormatDuration(r.dlo), " to ", absl::FormatDuration(r.dhi))
                    : absl::StrCat(Number(r.lo), " to ", Number(r.hi));
}

bool Within(const Range& r, const std::string& value) {
  if (r.duration) {
    absl::Duration d;
    return absl::ParseDuration(value, &d) && d >= r.dlo && d <= r.dhi;
  }
  double v = 0;
  return absl::SimpleAtod(value, &v) && v >= r.lo && v <= r.hi;  // false for nan
}

}  // namespace

bool RegisterFlagRange(const char* name, double lo, double hi) {
  Range r;
  r.lo = lo;
  r.hi = hi;
  Ranges()[name] = r;
  return true;
}

bool RegisterDurationFlagRange(const char* name, absl::Duration lo, absl::Duration hi) {
  Range r;
  r.dlo = lo;
  r.dhi = hi;
  r.duration = true;
  Ranges()[name] = r;
  return true;
}

std::string FlagRangeText(absl::string_view name) {
  const auto it = Ranges().find(std::string(name));
  return it == Ranges().end() ? "" : Text(it->second);
}

absl::Status CheckFlagRanges(absl::string_view main_file) {
  std::map<std::string, const absl::CommandLineFlag*> mine;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), main_file) && IsNumeric(*flag)) {
      mine.emplace(std::string(name), flag);
    }
  }
  for (const auto& [name, flag] : mine) {
    if (Ranges().count(name) == 0) {
      return absl::InternalError(absl::StrCat("the numeric flag --", name,
                                              " has no documented range (a defect of this build)"));
    }
  }
  for (const auto& [name, range] : Ranges()) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      return absl::InternalError(
          absl::StrCat("a range is given for --", name, ", which no flag has (a build defect)"));
    }
    const std::string value = flag->CurrentValue();
    if (!Within(range, value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "=", value, ": expected ", Text(range)));
    }
  }
  return absl::OkStatus();
}

}  // namespace asympo

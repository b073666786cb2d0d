#include "common/flag_usage.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <glog/logging.h>
#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flag_ranges.h"

#ifndef ASYMPO_VERSION
#define ASYMPO_VERSION "unknown"
#endif

namespace asympo {
namespace {

// The main file, then the files of AddProgramFlagFile.
std::vector<std::string>& FlagFiles() {
  static std::vector<std::string> files;
  return files;
}

bool IsProgramFlag(const absl::CommandLineFlag& flag) {
  for (const std::string& file : FlagFiles()) {
    if (absl::EndsWith(flag.Filename(), file)) return true;
  }
  return false;
}

absl::Status CheckProgramFlagRanges() {
  for (const std::string& file : FlagFiles()) {
    if (absl::Status s = CheckFlagRanges(file); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string ProgramName(const char* argv0) {
  const std::string path(argv0);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// `text` wrapped at 78 columns, each line indented by `indent`.
std::string Wrap(const std::string& text, const std::string& indent) {
  std::string out, line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > 78) {
      absl::StrAppend(&out, indent, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, indent, line, "\n");
  return out;
}

// The usage text and this program's flags, sorted, with their defaults;
// flags for tests ("Testing only: ...") are left out.
void PrintHelp() {
  std::string out = absl::StrCat(absl::ProgramUsageMessage(), "\n\nFlags:\n");
  std::map<std::string, const absl::CommandLineFlag*> mine;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsProgramFlag(*flag)) continue;
    if (absl::StartsWith(flag->Help(), "Testing only")) continue;
    mine.emplace(std::string(name), flag);
  }
  for (const auto& [name, flag] : mine) {
    const std::string range = FlagRangeText(name);
    absl::StrAppend(&out, "  --", name,
                    " (default: ", flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue(),
                    range.empty() ? "" : "; range ", range, ")\n", Wrap(flag->Help(), "      "));
  }
  absl::StrAppend(&out, "  --flagfile=FILE reads flags from FILE; --version prints the version.\n");
  std::fputs(out.c_str(), stdout);
}

// Each "--name=value" (or "--name value") of a flag this program knows,
// parsed the way ParseCommandLine will, so that a malformed value ends the
// program with INVALID_ARGUMENT naming the flag, the value and the range
// (exit 2) rather than Abseil's exit 1. Other forms are left to Abseil.
absl::Status CheckFlagValues(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    const size_t eq = arg.find('=');
    const std::string name(arg.substr(0, eq));
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr || name == "flagfile") continue;
    std::string value;
    if (eq != absl::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (!flag->IsOfType<bool>() && i + 1 < argc) {
      value = argv[++i];
    } else {
      continue;
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      const std::string range = FlagRangeText(name);
      return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, ": ", error,
                                                     range.empty() ? "" : "; expected ", range));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string VersionString(const char* argv0) {
  return absl::StrCat(ProgramName(argv0), " ", ASYMPO_VERSION, " (ASymPO-RL, ",
#ifdef NDEBUG
                      "release build"
#else
                      "optimized build with assertions"
#endif
                      ")");
}

void SetProgramUsage(const std::string& usage, const std::string& main_file) {
  absl::SetProgramUsageMessage(usage);
  FlagFiles() = {main_file};
}

void AddProgramFlagFile(const std::string& flag_file) { FlagFiles().push_back(flag_file); }

absl::Status ParseFlagsAndStartLogging(int argc, char** argv) {
  // --help and --version print to stdout and exit 0, before Abseil's own
  // handling (which exits 1 and lists the flags by source path).
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpfull" ||
        arg == "--helpshort") {
      if (absl::Status s = CheckProgramFlagRanges(); s.code() == absl::StatusCode::kInternal) {
        std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
        std::exit(1);
      }
      PrintHelp();
      std::exit(0);
    }
    if (arg == "--version" || arg == "-version") {
      std::printf("%s\n", VersionString(argv[0]).c_str());
      std::exit(0);
    }
  }
  if (absl::Status s = CheckFlagValues(argc, argv); !s.ok()) return s;
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", args[1], "\""));
  }
  if (absl::Status s = CheckProgramFlagRanges(); !s.ok()) return s;
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  return absl::OkStatus();
}

}  // namespace asympo

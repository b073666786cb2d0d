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

#ifndef ASYMPO_VERSION
#define ASYMPO_VERSION "unknown"
#endif

namespace asympo {
namespace {

std::string& MainFile() {
  static std::string file;
  return file;
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
    if (!absl::EndsWith(flag->Filename(), MainFile())) continue;
    if (absl::StartsWith(flag->Help(), "Testing only")) continue;
    mine.emplace(std::string(name), flag);
  }
  for (const auto& [name, flag] : mine) {
    absl::StrAppend(&out, "  --", name, " (default: ",
                    flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue(), ")\n",
                    Wrap(flag->Help(), "      "));
  }
  absl::StrAppend(&out, "  --flagfile=FILE reads flags from FILE; --version prints the version.\n");
  std::fputs(out.c_str(), stdout);
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
  MainFile() = main_file;
}

absl::Status ParseFlagsAndStartLogging(int argc, char** argv) {
  // --help and --version print to stdout and exit 0, before Abseil's own
  // handling (which exits 1 and lists the flags by source path).
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpfull" ||
        arg == "--helpshort") {
      PrintHelp();
      std::exit(0);
    }
    if (arg == "--version" || arg == "-version") {
      std::printf("%s\n", VersionString(argv[0]).c_str());
      std::exit(0);
    }
  }
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", args[1], "\""));
  }
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  return absl::OkStatus();
}

}  // namespace asympo

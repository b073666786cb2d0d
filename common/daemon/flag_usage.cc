#include "common/daemon/flag_usage.h"

#include <vector>

#include <glog/logging.h>
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace asympo::daemon {

void SetDaemonUsage(const std::string& usage, const std::string& main_file) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [main_file](absl::string_view path) {
    return absl::EndsWith(path, main_file);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
}

absl::Status ParseFlagsAndStartLogging(int argc, char** argv) {
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", args[1], "\""));
  }
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  return absl::OkStatus();
}

}  // namespace asympo::daemon

#include "common/daemon/flag_usage.h"

#include "absl/flags/usage.h"
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

}  // namespace asympo::daemon

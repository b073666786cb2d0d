// Environments for multi-turn episodes (proto/asympo/v1/environment.proto):
// where a rollout daemon sends the model's turns and gets back the tokens
// to insert, and at the end the reward.
//
// Calls are asynchronous: each takes a callback, run exactly once, on any
// thread (inline for the built-in environment, on gRPC's threads for a
// remote one). The daemon's generation thread never waits on a call.
//
//  - the remote environment: the asympo.v1.Environment service at
//    --environment=host:port, with TLS and a token as the daemon's other
//    clients, every call bounded by a deadline;
//  - the built-in one of a task that has one ("add_tool"'s calculator):
//    used when no --environment is given.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "asympo/v1/rollout.pb.h"
#include "common/security/tls.h"
#include "rollout_server/tasks/tasks.h"

namespace asympo::rollout {

// The model's turn, as Step sends it.
struct Turn {
  std::vector<int32_t> tokens;  // generated in this turn, its stop token included
  uint32_t index = 0;           // 0 for the first turn
  v1::FinishReason finish_reason = v1::FINISH_REASON_UNSPECIFIED;
  bool final = false;        // no turn can follow: the answer must be done
  uint32_t tokens_left = 0;  // response tokens still allowed
};

// What the environment answers to a turn.
struct TurnAnswer {
  std::vector<int32_t> append;  // inserted before the next turn (when not done)
  bool done = false;
  double reward = 0;  // when done
  bool correct = false;
};

// An episode_id has 1 to kMaxEpisodeIdBytes bytes (environment.proto); a
// longer one is never sent back.
inline constexpr size_t kMaxEpisodeIdBytes = 256;

// An answer that breaks the protocol (an episode_id out of bounds, a reward
// that is not finite or beyond the learner's max_abs_reward): an
// INVALID_ARGUMENT status marked so that the episode counts as
// invalid_answer, not as an error status of the environment's own.
absl::Status InvalidAnswer(absl::string_view message);
bool IsInvalidAnswer(const absl::Status& s);
// InvalidAnswer naming the call unless `id` has 1 to kMaxEpisodeIdBytes bytes.
absl::Status CheckEpisodeId(const std::string& id);
// InvalidAnswer unless a done answer's reward is finite and, when
// max_abs_reward > 0, within +-max_abs_reward.
absl::Status CheckReward(double reward, double max_abs_reward);

class Environment {
 public:
  using ResetDone = std::function<void(absl::StatusOr<std::string> episode_id)>;
  using StepDone = std::function<void(absl::StatusOr<TurnAnswer>)>;
  virtual ~Environment() = default;

  // Starts the episode of response `index` of the group on `prompt`.
  virtual void Reset(const TaskPrompt& prompt, uint32_t index, uint64_t seed, ResetDone done) = 0;
  virtual void Step(const std::string& episode_id, const Turn& turn, StepDone done) = 0;
  // Ends an episode (done or not); no answer.
  virtual void Close(const std::string& episode_id) = 0;
  // For logs: "the built-in calculator" or the address.
  virtual std::string name() const = 0;
};

struct RemoteEnvironmentOptions {
  std::string address;  // host:port
  security::ClientTlsOptions tls;
  std::string source;  // the daemon's id, sent with Reset
  // Deadline of each call.
  absl::Duration timeout = absl::Seconds(30);
};

// A client of the asympo.v1.Environment service. INVALID_ARGUMENT naming
// the flag for a bad address or TLS file. Answers are checked: an episode
// id of 1 to 256 bytes, a finite reward. Destroying it lets the calls in
// flight (the last Closes) end for up to a second, then cancels the rest
// and waits for their callbacks.
absl::StatusOr<std::unique_ptr<Environment>> CreateRemoteEnvironment(
    const RemoteEnvironmentOptions& options, prometheus::Registry& registry);

// The built-in environment of `task`, or null when the task has none
// (single-turn tasks). `task` must outlive it.
std::unique_ptr<Environment> CreateBuiltinEnvironment(const Task* task);

}  // namespace asympo::rollout

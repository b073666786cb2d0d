// A client of the asympo.v1.Environment service (environment.h): gRPC's
// callback API, every call with a deadline, answers checked. A call ends
// (End) only after its callback has run, so that destroying the client
// waits for the callbacks, which use their caller's state.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "asympo/v1/environment.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/listener/host_port.h"
#include "common/status_macros.h"
#include "rollout_server/episodes/environment.h"

namespace asympo::rollout {
namespace {

// How long a client being destroyed lets its calls in flight end on their
// own before it cancels them.
constexpr std::chrono::seconds kCloseGrace(1);

class RemoteEnvironment : public Environment {
 public:
  RemoteEnvironment(RemoteEnvironmentOptions options, std::shared_ptr<grpc::Channel> channel)
      : options_(std::move(options)),
        channel_(std::move(channel)),
        stub_(v1::Environment::NewStub(channel_)) {}

  // Gives the calls in flight (the last Closes, say) kCloseGrace to end,
  // then cancels the rest and waits for their callbacks.
  ~RemoteEnvironment() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!idle_.wait_for(lock, kCloseGrace, [this] { return live_.empty(); })) {
      for (grpc::ClientContext* c : live_) c->TryCancel();
    }
    idle_.wait(lock, [this] { return live_.empty(); });
  }

  void Reset(const TaskPrompt& prompt, uint32_t index, uint64_t seed, ResetDone done) override {
    auto* call = Begin<v1::ResetRequest, v1::ResetResponse>();
    call->request.set_prompt_id(prompt.prompt_id);
    call->request.mutable_prompt_tokens()->Assign(prompt.prompt_tokens.begin(),
                                                  prompt.prompt_tokens.end());
    call->request.set_reference(prompt.reference);
    call->request.set_response_index(index);
    call->request.set_seed(seed);
    call->request.set_source(options_.source);
    stub_->async()->Reset(&call->context, &call->request, &call->response,
                          [this, call, done = std::move(done)](grpc::Status s) {
                            absl::StatusOr<std::string> id =
                                s.ok() ? CheckedId(call->response.episode_id())
                                       : absl::StatusOr<std::string>(FromGrpcStatus(s, "Reset"));
                            done(std::move(id));
                            End(call);  // last: the destructor waits for it
                          });
  }

  void Step(const std::string& episode_id, const Turn& turn, StepDone done) override {
    auto* call = Begin<v1::StepRequest, v1::StepResponse>();
    call->request.set_episode_id(episode_id);
    call->request.mutable_turn_tokens()->Assign(turn.tokens.begin(), turn.tokens.end());
    call->request.set_turn(turn.index);
    call->request.set_finish_reason(turn.finish_reason);
    call->request.set_final(turn.final);
    call->request.set_tokens_left(turn.tokens_left);
    stub_->async()->Step(&call->context, &call->request, &call->response,
                         [this, call, done = std::move(done)](grpc::Status s) {
                           absl::StatusOr<TurnAnswer> answer =
                               s.ok() ? Checked(call->response)
                                      : absl::StatusOr<TurnAnswer>(FromGrpcStatus(s, "Step"));
                           done(std::move(answer));
                           End(call);
                         });
  }

  void Close(const std::string& episode_id) override {
    auto* call = Begin<v1::CloseRequest, v1::CloseResponse>();
    call->request.set_episode_id(episode_id);
    stub_->async()->Close(&call->context, &call->request, &call->response,
                          [this, call](grpc::Status) { End(call); });
  }

  std::string name() const override { return options_.address; }

 private:
  template <typename Request, typename Response>
  struct Call {
    grpc::ClientContext context;
    Request request;
    Response response;
  };

  template <typename Request, typename Response>
  Call<Request, Response>* Begin() {
    auto* call = new Call<Request, Response>();
    call->context.set_deadline(GrpcDeadline(options_.timeout));
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(&call->context);
    return call;
  }

  template <typename Call>
  void End(Call* call) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(&call->context);
    delete call;
    if (live_.empty()) idle_.notify_all();
  }

  static absl::StatusOr<std::string> CheckedId(const std::string& id) {
    ASYMPO_RETURN_IF_ERROR(CheckEpisodeId(id));
    return id;
  }

  static absl::StatusOr<TurnAnswer> Checked(const v1::StepResponse& r) {
    if (r.done()) ASYMPO_RETURN_IF_ERROR(CheckReward(r.reward(), /*max_abs_reward=*/0));
    TurnAnswer answer;
    answer.done = r.done();
    answer.reward = r.reward();
    answer.correct = r.correct();
    if (!r.done()) answer.append.assign(r.append_tokens().begin(), r.append_tokens().end());
    return answer;
  }

  const RemoteEnvironmentOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Environment::Stub> stub_;
  std::mutex mu_;
  std::condition_variable idle_;
  std::set<grpc::ClientContext*> live_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Environment>> CreateRemoteEnvironment(
    const RemoteEnvironmentOptions& options, prometheus::Registry& registry) {
  ASYMPO_RETURN_IF_ERROR(CheckAddressFlag("environment", options.address));
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--environment_timeout=", absl::FormatDuration(options.timeout), ": it must be positive"));
  }
  ASYMPO_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                          security::CreateClientChannel(options.address, options.tls, registry));
  return std::unique_ptr<Environment>(new RemoteEnvironment(options, std::move(channel)));
}

}  // namespace asympo::rollout

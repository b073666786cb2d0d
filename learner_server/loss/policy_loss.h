// The learner's policy objectives: ASymPO, SPO and the baselines.
//
// Every objective is computed from the same inputs: each response's per-token
// log-probs under the current policy, a mask, the scalar rewards and the
// group each response belongs to (and, for the `grpo` baseline only, the
// behavior policy's log-probs). docs/method.md gives each objective's
// equation exactly as implemented here.
//
// PolicyLoss is immutable after Create() and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/statusor.h"
#include "learner_server/loss/advantages.h"

namespace asympo::learner {

enum class Objective { kNaive, kSpo, kAsympo, kAsympoStable, kGrpo, kGpg };

// "naive", "spo", "asympo", "asympo_stable", "grpo", "gpg".
std::string_view ObjectiveName(Objective objective);
absl::StatusOr<Objective> ParseObjective(std::string_view name);
// Every name ParseObjective accepts, in a fixed order.
const std::vector<std::string_view>& ObjectiveNames();

// asympo's denominator is max(sg(S_g), kAsympoScaleFloor) nats: below it a
// response's mean NLL is not resolved in float32 (a log-prob rounds to 0 once
// its competitors hold less than about 6e-8), and dividing by it would blow a
// vanishing gradient up to 1e30 and more.
inline constexpr double kAsympoScaleFloor = 1e-6;

struct PolicyLossOptions {
  Objective objective = Objective::kAsympo;
  AdvantageOptions advantage;
  // spo: negative advantages are multiplied by alpha, in [0, 1].
  double spo_alpha = 0.2;
  // asympo_stable: token log-probs are clipped to log(p_high) in responses
  // with A >= 0 and to log(p_low) in responses with A < 0; the scale in the
  // denominator is floored at scale_floor (nats). 0 < p_low < p_high <= 1.
  double p_low = 0.02;
  double p_high = 0.99;
  double scale_floor = 1e-2;
  // grpo: PPO clip range [1 - clip_eps_low, 1 + clip_eps_high].
  double clip_eps_low = 0.2;
  double clip_eps_high = 0.2;
  // grpo: the dual clip (0: off; else > 1, VeRL's clip_ratio_c, 3 there): a
  // token with A < 0 loses at most -clip_ratio_c * A, so a ratio far above
  // 1 (a token the behavior policy found unlikely) cannot blow the step up.
  double clip_ratio_c = 0.0;
  // gpg: multiply the gradient by alpha = B / (B - M) (B responses, M of them
  // in groups whose rewards are all equal), the paper's correction.
  bool gpg_gradient_correction = true;
};

// Totals of the whole optimizer step, when one Compute() call sees only one
// micro-batch of it. With them, the losses of the micro-batches of a step sum
// to the loss of the step computed at once (and so do their gradients).
// Groups are never split across micro-batches.
struct StepTotals {
  int64_t groups = 0;     // prompt groups in the step
  int64_t responses = 0;  // responses in the step
  int64_t tokens = 0;     // response tokens in the step
  // Responses in groups whose rewards are all equal (gpg's M).
  int64_t degenerate_responses = 0;
  // The step's nominal size in groups (--prompts_per_step); 0: none. A
  // short step (fewer groups) weights each group as a step of this size
  // does: its loss is scaled by groups / step_groups.
  int64_t step_groups = 0;
};

struct LossInputs {
  // (N, T) log pi_theta(a_t | x, a_<t) of each response token under the
  // current policy; gradients flow through it. Positions where mask is false
  // are ignored, whatever they hold (NaN included).
  at::Tensor token_logprobs;
  // (N, T) bool (or 0/1): true on real response tokens. Every row needs at
  // least one.
  at::Tensor mask;
  // (N,) floating, finite.
  at::Tensor rewards;
  // (N,) int64 in [0, num_groups); every group needs at least 2 responses.
  at::Tensor group_index;
  int64_t num_groups = 0;
  // (N, T) behavior-policy log-probs; required by grpo, ignored otherwise.
  std::optional<at::Tensor> behavior_logprobs;
  // Set when this call is one micro-batch of a larger step (see StepTotals).
  std::optional<StepTotals> step_totals;
};

// Per-step diagnostics (docs/method.md), computed from the same tensors
// as the loss without another forward pass. With S_g the mean token NLL of
// response g and A_g its advantage, per group B = sum_{A>0} A_g,
// S_P = (1/B) sum_{A>0} A_g S_g, S_N = (1/B) sum_{A<0} |A_g| S_g. Batch
// values pool the sums over groups: s_pos = sum_p B_p S_P,p / sum_p B_p.
struct LossDiagnostics {
  double loss = 0.0;
  double s_pos = 0.0;        // batch S_P (0 when no group has A != 0)
  double s_neg = 0.0;        // batch S_N
  double naive_ratio = 0.0;  // R = S_N / S_P (0 when S_P is 0)
  double imbalance = 0.0;    // mean over groups of Delta = sum_g A_g S_g
  // Fraction of response tokens whose gradient a bound zeroes: asympo_stable
  // (log p_low in A<0 responses, log p_high in A>0 ones) and grpo (ratio
  // below 1-eps with A<0, above 1+eps with A>0). 0 for other objectives.
  double clip_low_fraction = 0.0;
  double clip_high_fraction = 0.0;
  double mean_response_length = 0.0;  // tokens per response
  double mean_nll = 0.0;              // -mean token log-prob (entropy proxy)
  double reward_mean = 0.0;
  double reward_std = 0.0;  // population std over the batch's responses
  // Fraction of groups whose rewards are all equal (no learning signal).
  double degenerate_group_fraction = 0.0;
  // gpg's gradient correction B / (B - M) actually applied (1 otherwise).
  double gpg_alpha = 1.0;
  int64_t groups = 0;
  int64_t responses = 0;
  int64_t tokens = 0;
  // Per-group values, (P,) float64, for tests and detailed logging.
  at::Tensor group_positive_mass;  // B_p
  at::Tensor group_s_pos;          // S_P,p (0 where B_p = 0)
  at::Tensor group_s_neg;          // S_N,p
  at::Tensor group_imbalance;      // Delta_p
  // Per-response values, (N,) float64.
  at::Tensor advantages;      // A_g
  at::Tensor response_scale;  // S_g (unclipped)
};

struct LossOutput {
  at::Tensor loss;  // scalar, differentiable; minimize it
  LossDiagnostics diagnostics;
};

class PolicyLoss {
 public:
  // Checks the options; INVALID_ARGUMENT names the bad option.
  static absl::StatusOr<PolicyLoss> Create(const PolicyLossOptions& options);

  // Validates the inputs (shapes, finiteness of rewards and of log-probs on
  // masked-in tokens, group sizes, empty responses, behavior log-probs when
  // needed) and returns the loss with its diagnostics. Errors name the
  // response, group or tensor at fault and never modify the inputs. A
  // LibTorch exception comes back as a status too.
  absl::StatusOr<LossOutput> Compute(const LossInputs& inputs) const;

  const PolicyLossOptions& options() const { return options_; }
  Objective objective() const { return options_.objective; }
  bool needs_behavior_logprobs() const { return options_.objective == Objective::kGrpo; }

 private:
  explicit PolicyLoss(const PolicyLossOptions& options) : options_(options) {}
  absl::StatusOr<LossOutput> ComputeUnguarded(const LossInputs& inputs) const;
  PolicyLossOptions options_;
};

}  // namespace asympo::learner

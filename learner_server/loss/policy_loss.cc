#include "learner_server/loss/policy_loss.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"

namespace asympo::learner {
namespace {

// Everything the objectives share, computed once per call.
struct Prepared {
  at::Tensor mask;     // (N, T) bool
  at::Tensor logp;     // (N, T) current log-probs, 0 on padding; differentiable
  at::Tensor lengths;  // (N,) m_g, in the log-probs' dtype
  at::Tensor scale;    // (N,) S_g = -(1/m_g) sum_t l_gt; differentiable
  at::Tensor adv64;    // (N,) float64 advantages
  at::Tensor adv;      // (N,) advantages in the log-probs' dtype
  at::Tensor group;    // (N,) int64 group of each response
  at::Tensor weight;   // (N,) 1 / (groups * G_p): mean over prompts, then group
  at::Tensor mass;     // (P,) float64 B_p, sum of positive advantages (0: degenerate)
  GroupLayout layout;
  int64_t tokens = 0;  // real tokens in this call
  StepTotals totals;   // of the step (this call's own when not given)
};

// Index of the first true element of a boolean tensor, as (row, col).
std::pair<int64_t, int64_t> FirstTrue(const at::Tensor& b) {
  const at::Tensor idx = b.nonzero();  // (K, 2), row-major order
  return {idx[0][0].item<int64_t>(), idx[0][1].item<int64_t>()};
}

absl::Status CheckTokenTensor(const at::Tensor& t, const at::Tensor& mask, const char* name) {
  if (!t.defined() || t.dim() != 2 || !at::isFloatingType(t.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be a floating (N, T) tensor"));
  }
  if (t.sizes() != mask.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has shape [", absl::StrJoin(t.sizes(), ", "), "] but mask has [",
                     absl::StrJoin(mask.sizes(), ", "), "]; they must match"));
  }
  const at::Tensor bad = at::logical_and(at::isfinite(t).logical_not(), mask);
  if (bad.any().item<bool>()) {
    const auto [n, i] = FirstTrue(bad);
    return absl::InvalidArgumentError(absl::StrCat(name, " of response ", n, " token ", i, " is ",
                                                   t[n][i].item<double>(),
                                                   "; log-probs must be finite"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Prepared> Prepare(const LossInputs& in, const PolicyLossOptions& options,
                                 bool needs_behavior) {
  if (!in.token_logprobs.defined() || in.token_logprobs.dim() != 2) {
    return absl::InvalidArgumentError("token_logprobs must be a floating (N, T) tensor");
  }
  if (!in.mask.defined() || in.mask.dim() != 2) {
    return absl::InvalidArgumentError("mask must be an (N, T) tensor");
  }
  Prepared p;
  p.mask = in.mask.to(in.token_logprobs.device(), at::kBool);
  ASYMPO_RETURN_IF_ERROR(CheckTokenTensor(in.token_logprobs, p.mask, "token_logprobs"));
  const int64_t n = in.token_logprobs.size(0);
  if (!in.rewards.defined() || in.rewards.dim() != 1 || in.rewards.size(0) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("rewards must be a 1-D tensor with one entry per response (", n, ")"));
  }
  const at::Tensor lengths = p.mask.sum(1);  // (N,) int64
  if (n > 0 && (lengths == 0).any().item<bool>()) {
    const int64_t i = (lengths == 0).nonzero().min().item<int64_t>();
    return absl::InvalidArgumentError(absl::StrCat(
        "response ", i, " has no tokens (its mask row is empty); every response needs one"));
  }
  if (needs_behavior) {
    if (!in.behavior_logprobs.has_value()) {
      return absl::InvalidArgumentError(
          "the grpo objective needs behavior_logprobs (the sampling policy's token log-probs); "
          "none were given");
    }
    ASYMPO_RETURN_IF_ERROR(CheckTokenTensor(*in.behavior_logprobs, p.mask, "behavior_logprobs"));
  }
  ASYMPO_ASSIGN_OR_RETURN(p.layout, ValidateGroups(in.rewards, in.group_index, in.num_groups));
  ASYMPO_ASSIGN_OR_RETURN(p.adv64, ComputeGroupAdvantages(in.rewards, in.group_index, in.num_groups,
                                                          options.advantage));

  const auto dtype = in.token_logprobs.scalar_type();
  const auto device = in.token_logprobs.device();
  p.group = in.group_index.to(device);
  p.adv64 = p.adv64.to(device);
  p.adv = p.adv64.to(dtype);
  p.logp = in.token_logprobs.masked_fill(p.mask.logical_not(), 0.0);
  p.lengths = lengths.to(dtype);
  p.scale = -p.logp.sum(1) / p.lengths;
  p.tokens = lengths.sum().item<int64_t>();

  // Groups with no positive advantage have all-equal rewards.
  p.mass =
      at::zeros({in.num_groups}, p.adv64.options()).index_add_(0, p.group, p.adv64.clamp_min(0));
  const at::Tensor degenerate = p.mass == 0;
  const int64_t degenerate_responses =
      p.layout.sizes.to(device).masked_select(degenerate).sum().item<double>();
  StepTotals own{in.num_groups, n, p.tokens, degenerate_responses};
  if (in.step_totals.has_value()) {
    const StepTotals& s = *in.step_totals;
    if (s.groups < own.groups || s.responses < own.responses || s.tokens < own.tokens ||
        s.degenerate_responses < 0 || s.degenerate_responses > s.responses) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step_totals (groups ", s.groups, ", responses ", s.responses, ", tokens ", s.tokens,
          ", degenerate ", s.degenerate_responses, ") cannot contain this micro-batch (groups ",
          own.groups, ", responses ", own.responses, ", tokens ", own.tokens, ")"));
    }
    p.totals = s;
  } else {
    p.totals = own;
  }
  const at::Tensor sizes = p.layout.sizes.to(device).index_select(0, p.group);
  p.weight = (1.0 / (sizes * static_cast<double>(p.totals.groups))).to(dtype);
  return p;
}

double ToDouble(const at::Tensor& t) { return t.item<double>(); }

double Fraction(const at::Tensor& flags, int64_t tokens) {
  return tokens == 0 ? 0.0 : flags.sum().item<double>() / static_cast<double>(tokens);
}

void FillDiagnostics(const Prepared& p, const at::Tensor& rewards, LossDiagnostics* d) {
  const int64_t groups = p.layout.num_groups;
  const at::Tensor s = p.scale.detach().to(at::kDouble);  // (N,)
  const at::Tensor a = p.adv64;                           // (N,)
  const at::Tensor as = a * s;
  const auto zeros = [&] { return at::zeros({groups}, a.options()); };
  const at::Tensor pos = a > 0, neg = a < 0;
  const at::Tensor& mass = p.mass;
  const at::Tensor pos_sum = zeros().index_add_(0, p.group, as.masked_fill(pos.logical_not(), 0));
  const at::Tensor neg_sum =
      zeros().index_add_(0, p.group, (-as).masked_fill(neg.logical_not(), 0));
  const at::Tensor safe_mass = at::where(mass > 0, mass, at::ones_like(mass));
  d->group_positive_mass = mass;
  d->group_s_pos = at::where(mass > 0, pos_sum / safe_mass, at::zeros_like(mass));
  d->group_s_neg = at::where(mass > 0, neg_sum / safe_mass, at::zeros_like(mass));
  d->group_imbalance = zeros().index_add_(0, p.group, as);
  const double total_mass = ToDouble(mass.sum());
  if (total_mass > 0) {
    d->s_pos = ToDouble(pos_sum.sum()) / total_mass;
    d->s_neg = ToDouble(neg_sum.sum()) / total_mass;
    d->naive_ratio = d->s_pos > 0 ? d->s_neg / d->s_pos : 0.0;
  }
  d->imbalance = ToDouble(d->group_imbalance.mean());
  d->mean_response_length = ToDouble(p.lengths.to(at::kDouble).mean());
  d->mean_nll = -ToDouble(p.logp.detach().to(at::kDouble).sum()) / static_cast<double>(p.tokens);
  const at::Tensor r = rewards.detach().to(at::kDouble);
  d->reward_mean = ToDouble(r.mean());
  d->reward_std = ToDouble(r.std(/*unbiased=*/false));
  d->degenerate_group_fraction = ToDouble((mass == 0).to(at::kDouble).mean());
  d->groups = groups;
  d->responses = a.size(0);
  d->tokens = p.tokens;
  d->advantages = a;
  d->response_scale = s;
}

}  // namespace

const std::vector<std::string_view>& ObjectiveNames() {
  static const auto* names =
      new std::vector<std::string_view>{"naive", "spo", "asympo", "asympo_stable", "grpo", "gpg"};
  return *names;
}

std::string_view ObjectiveName(Objective objective) {
  return ObjectiveNames()[static_cast<size_t>(objective)];
}

absl::StatusOr<Objective> ParseObjective(std::string_view name) {
  const auto& names = ObjectiveNames();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<Objective>(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown objective \"", std::string(name), "\"; expected one of ",
                   absl::StrJoin(names, ", ", [](std::string* out, std::string_view n) {
                     out->append(n.data(), n.size());
                   })));
}

absl::StatusOr<PolicyLoss> PolicyLoss::Create(const PolicyLossOptions& o) {
  const auto bad = [](const char* name, double v, const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is ", v, "; ", rule));
  };
  if (!(o.spo_alpha >= 0.0 && o.spo_alpha <= 1.0)) {
    return bad("spo_alpha", o.spo_alpha, "it must be in [0, 1]");
  }
  if (!(o.p_low > 0.0 && o.p_low < 1.0)) return bad("p_low", o.p_low, "it must be in (0, 1)");
  if (!(o.p_high > o.p_low && o.p_high <= 1.0)) {
    return bad("p_high", o.p_high, "it must be in (p_low, 1]");
  }
  if (!(o.scale_floor > 0.0 && std::isfinite(o.scale_floor))) {
    return bad("scale_floor", o.scale_floor, "it must be positive and finite");
  }
  if (!(o.clip_eps_low > 0.0 && o.clip_eps_low < 1.0)) {
    return bad("clip_eps_low", o.clip_eps_low, "it must be in (0, 1)");
  }
  if (!(o.clip_eps_high > 0.0 && std::isfinite(o.clip_eps_high))) {
    return bad("clip_eps_high", o.clip_eps_high, "it must be positive and finite");
  }
  if (!(o.clip_ratio_c == 0.0 || (o.clip_ratio_c > 1.0 && std::isfinite(o.clip_ratio_c)))) {
    return bad("clip_ratio_c", o.clip_ratio_c, "it must be 0 (off) or above 1, finite");
  }
  if (o.advantage.normalization == AdvantageNormalization::kMeanStd &&
      !(o.advantage.std_epsilon > 0.0)) {
    return bad("std_epsilon", o.advantage.std_epsilon,
               "it must be positive with mean_std normalization");
  }
  if (static_cast<size_t>(o.objective) >= ObjectiveNames().size()) {
    return absl::InvalidArgumentError("objective is not one of the known objectives");
  }
  return PolicyLoss(o);
}

namespace {

// A_g S_g / sg(S_g): forward value A_g, gradient (A_g / S_g) grad S_g.
at::Tensor AsympoLoss(const Prepared& p) {
  // A real floor (kAsympoScaleFloor): in float32 a near-certain token's
  // log-prob rounds to exactly 0 while its gradient does not, so S_g can be 0
  // (or tiny and inaccurate) with grad S_g != 0.
  const at::Tensor denom = p.scale.detach().clamp_min(kAsympoScaleFloor);
  // S_g / sg(S_g) first: its forward value is exactly 1, so the loss is
  // exactly sum of weight * A (0 for zero-sum advantages, up to the
  // rounding of the advantages themselves).
  return (p.weight * p.adv * (p.scale / denom)).sum();
}

// asympo with token log-probs clipped at the bounds: clamp_max / clamp_min
// pass no gradient past the bound, but the clipped value still enters the
// scale. Sets the clip fractions.
at::Tensor AsympoStableLoss(const Prepared& p, const PolicyLossOptions& o, LossDiagnostics* d) {
  const at::Tensor adv_col = p.adv.unsqueeze(1);  // (N, 1)
  const double log_high = std::log(o.p_high), log_low = std::log(o.p_low);
  const at::Tensor clipped =
      at::where(adv_col >= 0, p.logp.clamp_max(log_high), p.logp.clamp_min(log_low))
          .masked_fill(p.mask.logical_not(), 0.0);
  const at::Tensor scale_hat = -clipped.sum(1) / p.lengths;  // (N,)
  const at::Tensor logp = p.logp.detach();
  d->clip_high_fraction =
      Fraction(at::logical_and(at::logical_and(adv_col > 0, logp > log_high), p.mask), p.tokens);
  d->clip_low_fraction =
      Fraction(at::logical_and(at::logical_and(adv_col < 0, logp < log_low), p.mask), p.tokens);
  return (p.weight * p.adv * (scale_hat / scale_hat.detach().clamp_min(o.scale_floor))).sum();
}

// PPO-clip on token ratios, response-mean then group-mean. Sets the clip
// fractions.
at::Tensor GrpoLoss(const Prepared& p, const at::Tensor& behavior_logprobs,
                    const PolicyLossOptions& o, LossDiagnostics* d) {
  const at::Tensor not_mask = p.mask.logical_not();
  const at::Tensor adv_col = p.adv.unsqueeze(1);  // (N, 1)
  const at::Tensor behavior =
      behavior_logprobs.to(p.logp.device(), p.logp.scalar_type()).masked_fill(not_mask, 0.0);
  const at::Tensor ratio = at::exp(p.logp - behavior);  // (N, T), 1 on padding
  const at::Tensor clipped_ratio = ratio.clamp(1.0 - o.clip_eps_low, 1.0 + o.clip_eps_high);
  at::Tensor surrogate = at::minimum(ratio * adv_col, clipped_ratio * adv_col);
  if (o.clip_ratio_c > 0) {
    // The dual clip: with A < 0 the surrogate is at least c A.
    surrogate = at::where(adv_col < 0, at::maximum(surrogate, o.clip_ratio_c * adv_col), surrogate);
  }
  const at::Tensor per_response = -surrogate.masked_fill(not_mask, 0.0).sum(1) / p.lengths;
  const at::Tensor r = ratio.detach();
  d->clip_high_fraction = Fraction(
      at::logical_and(at::logical_and(adv_col > 0, r > 1.0 + o.clip_eps_high), p.mask), p.tokens);
  d->clip_low_fraction = Fraction(
      at::logical_and(at::logical_and(adv_col < 0, r < 1.0 - o.clip_eps_low), p.mask), p.tokens);
  return (p.weight * per_response).sum();
}

// -alpha * sum_{g,t} A_g l_gt / (tokens in the step), alpha = B/(B-M).
// Sets gpg_alpha.
at::Tensor GpgLoss(const Prepared& p, const PolicyLossOptions& o, LossDiagnostics* d) {
  const int64_t valid = p.totals.responses - p.totals.degenerate_responses;
  d->gpg_alpha = (o.gpg_gradient_correction && valid > 0)
                     ? static_cast<double>(p.totals.responses) / static_cast<double>(valid)
                     : 1.0;
  return -(p.adv.unsqueeze(1) * p.logp).sum() *
         (d->gpg_alpha / static_cast<double>(p.totals.tokens));
}

}  // namespace

absl::StatusOr<LossOutput> PolicyLoss::Compute(const LossInputs& in) const {
  return GuardTorch("policy loss", [&] { return ComputeUnguarded(in); });
}

absl::StatusOr<LossOutput> PolicyLoss::ComputeUnguarded(const LossInputs& in) const {
  ASYMPO_ASSIGN_OR_RETURN(Prepared p, Prepare(in, options_, needs_behavior_logprobs()));
  const PolicyLossOptions& o = options_;
  LossOutput out;
  LossDiagnostics& d = out.diagnostics;
  switch (o.objective) {
    case Objective::kNaive:
      // (1/G) sum_g A_g S_g per group, mean over groups.
      out.loss = (p.weight * p.adv * p.scale).sum();
      break;
    case Objective::kSpo: {
      const at::Tensor shaped = at::where(p.adv >= 0, p.adv, p.adv * o.spo_alpha);
      out.loss = (p.weight * shaped * p.scale).sum();
      break;
    }
    case Objective::kAsympo:
      out.loss = AsympoLoss(p);
      break;
    case Objective::kAsympoStable:
      out.loss = AsympoStableLoss(p, o, &d);
      break;
    case Objective::kGrpo:
      out.loss = GrpoLoss(p, *in.behavior_logprobs, o, &d);
      break;
    case Objective::kGpg:
      out.loss = GpgLoss(p, o, &d);
      break;
  }
  if (p.totals.step_groups > p.totals.groups) {
    // A short step: each group weighs what it weighs in a full step.
    out.loss = out.loss *
               (static_cast<double>(p.totals.groups) / static_cast<double>(p.totals.step_groups));
  }
  FillDiagnostics(p, in.rewards, &d);
  d.loss = out.loss.detach().item<double>();
  return out;
}

}  // namespace asympo::learner

#include "learner_server/loss/loss_diagnostics.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

namespace asympo::learner {

void DiagnosticSums::Add(const LossDiagnostics& d) {
  loss += d.loss;
  positive_mass += d.group_positive_mass.sum().item<double>();
  s_pos += (d.group_positive_mass * d.group_s_pos).sum().item<double>();
  s_neg += (d.group_positive_mass * d.group_s_neg).sum().item<double>();
  imbalance += d.group_imbalance.sum().item<double>();
  const double t = static_cast<double>(d.tokens);
  const double r = static_cast<double>(d.responses);
  clip_low += d.clip_low_fraction * t;
  clip_high += d.clip_high_fraction * t;
  nll += d.mean_nll * t;
  response_length += d.mean_response_length * r;
  reward += d.reward_mean * r;
  reward_squared += (d.reward_std * d.reward_std + d.reward_mean * d.reward_mean) * r;
  degenerate_groups += d.degenerate_group_fraction * static_cast<double>(d.groups);
  gpg_alpha = d.gpg_alpha;
  groups += d.groups;
  responses += d.responses;
  tokens += d.tokens;
}

LossDiagnostics DiagnosticSums::Pooled() const {
  LossDiagnostics d;
  d.loss = loss;
  if (positive_mass > 0) {
    d.s_pos = s_pos / positive_mass;
    d.s_neg = s_neg / positive_mass;
    d.naive_ratio = d.s_pos > 0 ? d.s_neg / d.s_pos : 0.0;
  }
  const double g = static_cast<double>(std::max<int64_t>(groups, 1));
  const double r = static_cast<double>(std::max<int64_t>(responses, 1));
  const double t = static_cast<double>(std::max<int64_t>(tokens, 1));
  d.imbalance = imbalance / g;
  d.clip_low_fraction = clip_low / t;
  d.clip_high_fraction = clip_high / t;
  d.mean_nll = nll / t;
  d.mean_response_length = response_length / r;
  d.reward_mean = reward / r;
  d.reward_std = std::sqrt(std::max(0.0, reward_squared / r - d.reward_mean * d.reward_mean));
  d.degenerate_group_fraction = degenerate_groups / g;
  d.gpg_alpha = gpg_alpha;
  d.groups = groups;
  d.responses = responses;
  d.tokens = tokens;
  return d;
}

}  // namespace asympo::learner

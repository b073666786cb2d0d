#include "learner_server/reward_monitor.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asympo::learner {
namespace {

using nlohmann::json;

json StateJson(const CollapseState& s) {
  return {{"steps", s.steps},
          {"below", s.below},
          {"ema", s.ema},
          {"peak", s.peak},
          {"suspected", s.suspected}};
}

absl::Status Bad(const std::string& where, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("reward_monitor: ", where, " ", why));
}

// A count: a non-negative integer.
absl::StatusOr<int64_t> CountAt(const json& o, const char* key, const std::string& where) {
  const auto it = o.find(key);
  if (it == o.end() || !it->is_number_integer() || it->get<int64_t>() < 0 ||
      (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{1} << 62)) {
    return Bad(absl::StrCat(where, ".", key), "is missing or not a count");
  }
  return it->get<int64_t>();
}

absl::StatusOr<double> FiniteAt(const json& o, const char* key, const std::string& where) {
  const auto it = o.find(key);
  if (it == o.end() || !it->is_number() || !std::isfinite(it->get<double>())) {
    return Bad(absl::StrCat(where, ".", key), "is missing or not a finite number");
  }
  return it->get<double>();
}

absl::StatusOr<CollapseState> ParseState(const json& o, const std::string& where) {
  if (!o.is_object()) return Bad(where, "is not an object");
  CollapseState s;
  ASYMPO_ASSIGN_OR_RETURN(s.steps, CountAt(o, "steps", where));
  ASYMPO_ASSIGN_OR_RETURN(s.below, CountAt(o, "below", where));
  ASYMPO_ASSIGN_OR_RETURN(s.ema, FiniteAt(o, "ema", where));
  ASYMPO_ASSIGN_OR_RETURN(s.peak, FiniteAt(o, "peak", where));
  const auto suspected = o.find("suspected");
  if (suspected == o.end() || !suspected->is_boolean()) {
    return Bad(absl::StrCat(where, ".suspected"), "is missing or not true/false");
  }
  s.suspected = suspected->get<bool>();
  return s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

absl::Status ValidateCollapseOptions(const CollapseOptions& o) {
  if (!(o.ema_alpha > 0 && o.ema_alpha <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("collapse ema_alpha is ", o.ema_alpha, "; it must be in (0, 1]"));
  }
  if (o.warmup_steps < 0) {
    return absl::InvalidArgumentError("collapse warmup_steps must be >= 0");
  }
  if (!(o.drop_fraction > 0 && o.drop_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("collapse drop_fraction is ", o.drop_fraction, "; it must be in (0, 1)"));
  }
  if (!(o.recover_fraction > 0 && o.recover_fraction <= o.drop_fraction)) {
    return absl::InvalidArgumentError(
        absl::StrCat("collapse recover_fraction is ", o.recover_fraction,
                     "; it must be in (0, drop_fraction ", o.drop_fraction, "]"));
  }
  if (!(o.min_drop >= 0) || !std::isfinite(o.min_drop)) {
    return absl::InvalidArgumentError(
        absl::StrCat("collapse min_drop is ", o.min_drop, "; it must be >= 0"));
  }
  if (o.confirm_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("collapse confirm_steps is ", o.confirm_steps, "; it must be >= 1"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRewardMonitorOptions(const RewardMonitorOptions& o) {
  ASYMPO_RETURN_IF_ERROR(ValidateCollapseOptions(o.collapse));
  if (o.max_sources < 1 || o.max_sources > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("reward max_sources is ", o.max_sources, "; it must be in [1, 1024]"));
  }
  if (o.source_idle_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("reward source_idle_steps is ", o.source_idle_steps, "; it must be >= 1"));
  }
  return absl::OkStatus();
}

bool CollapseDetector::Observe(double reward_mean) {
  const double a = options_.ema_alpha;
  return ObserveSmoothed(state_.steps == 0 ? reward_mean : (1 - a) * state_.ema + a * reward_mean);
}

bool CollapseDetector::ObserveSmoothed(double ema) {
  CollapseState& s = state_;
  s.ema = ema;
  ++s.steps;
  if (s.steps <= options_.warmup_steps) {
    s.peak = s.ema;  // the peak counts only from the end of warm-up
    s.suspected = false;
    return false;
  }
  s.peak = std::max(s.peak, s.ema);
  const double drop = s.peak - s.ema;
  if (s.suspected) {
    s.suspected = drop > options_.recover_fraction * std::abs(s.peak);
    if (!s.suspected) s.below = 0;
    return s.suspected;
  }
  const bool past = drop > options_.drop_fraction * std::abs(s.peak) && drop >= options_.min_drop;
  s.below = past ? s.below + 1 : 0;
  s.suspected = s.below >= options_.confirm_steps;
  return s.suspected;
}

std::vector<SourceReward> GroupRewards(const std::vector<QueuedGroup>& groups) {
  std::vector<SourceReward> out;
  out.reserve(groups.size());
  for (const QueuedGroup& g : groups) {
    SourceReward r{g.source, 0, g.group.responses_size()};
    for (const auto& response : g.group.responses()) r.sum += response.reward();
    out.push_back(std::move(r));
  }
  return out;
}

RewardMonitor::RewardMonitor(RewardMonitorOptions options)
    : options_(options), fleet_(options.collapse) {}

std::string RewardMonitor::LabelOf(const std::string& source) const {
  const std::string label = source.empty() ? kNoSource : source;
  if (sources_.count(label) > 0) return label;
  const size_t own = sources_.size() - sources_.count(kOtherSources);
  return own < static_cast<size_t>(options_.max_sources) ? label : kOtherSources;
}

void RewardMonitor::Observe(const std::vector<SourceReward>& groups) {
  std::map<std::string, std::pair<double, int64_t>> step;  // by label: sum, responses
  for (const SourceReward& g : groups) {
    if (g.responses <= 0) continue;
    // A new label takes its place at once: the next group's LabelOf counts it.
    const std::string label = LabelOf(g.source);
    sources_.try_emplace(label, Source{CollapseDetector(options_.collapse), 0});
    auto& [sum, n] = step[label];
    sum += g.sum;
    n += g.responses;
  }
  if (step.empty()) return;
  ++step_;
  for (const auto& [label, sum_n] : step) {
    Source& s = sources_.at(label);
    s.detector.Observe(sum_n.first / static_cast<double>(sum_n.second));
    s.last_step = step_;
  }
  std::vector<double> emas;
  for (const auto& [label, s] : sources_) {
    if (step_ - s.last_step < options_.source_idle_steps) emas.push_back(s.detector.ema());
  }
  active_ = static_cast<int>(emas.size());
  fleet_.ObserveSmoothed(Median(std::move(emas)));
}

std::string RewardMonitor::ToJson() const {
  json sources = json::array();
  for (const auto& [label, s] : sources_) {
    json o = StateJson(s.detector.state());
    o["source"] = label;
    o["last_step"] = s.last_step;
    sources.push_back(std::move(o));
  }
  return json{{"step", step_}, {"fleet", StateJson(fleet_.state())}, {"sources", sources}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

absl::Status RewardMonitor::Restore(std::string_view text) {
  const json o = json::parse(text, nullptr, false);
  if (o.is_discarded() || !o.is_object()) return Bad("the state", "is not a JSON object");
  ASYMPO_ASSIGN_OR_RETURN(const int64_t step, CountAt(o, "step", "the state"));
  const auto fleet = o.find("fleet");
  if (fleet == o.end()) return Bad("fleet", "is missing");
  ASYMPO_ASSIGN_OR_RETURN(const CollapseState fleet_state, ParseState(*fleet, "fleet"));
  const auto list = o.find("sources");
  if (list == o.end() || !list->is_array()) return Bad("sources", "is missing or not a list");
  if (list->size() > static_cast<size_t>(options_.max_sources) + 1) {
    return Bad("sources", absl::StrCat("holds ", list->size(), " sources, more than max_sources ",
                                       options_.max_sources, " and the shared one"));
  }
  std::map<std::string, Source> sources;
  for (size_t i = 0; i < list->size(); ++i) {
    const json& e = (*list)[i];
    const std::string where = absl::StrCat("sources[", i, "]");
    ASYMPO_ASSIGN_OR_RETURN(const CollapseState state, ParseState(e, where));
    const auto name = e.find("source");
    if (name == e.end() || !name->is_string() || name->get<std::string>().empty() ||
        name->get<std::string>().size() > 128) {
      return Bad(where + ".source", "is missing or not a name of 1-128 characters");
    }
    ASYMPO_ASSIGN_OR_RETURN(const int64_t last, CountAt(e, "last_step", where));
    if (last > step) return Bad(where + ".last_step", absl::StrCat("is after step ", step));
    Source s{CollapseDetector(options_.collapse), last};
    s.detector.Restore(state);
    if (!sources.emplace(name->get<std::string>(), std::move(s)).second) {
      return Bad(where + ".source", "names a source twice");
    }
  }
  step_ = step;
  fleet_.Restore(fleet_state);
  sources_ = std::move(sources);
  active_ = 0;
  for (const auto& [label, s] : sources_)
    active_ += step_ - s.last_step < options_.source_idle_steps;
  return absl::OkStatus();
}

}  // namespace asympo::learner

#include "rollout_server/engine/continuous_engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include "absl/strings/str_cat.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"

namespace asympo::rollout {
namespace {

// Stop ids a slot holds before its row widens (the graphs are recaptured).
constexpr int64_t kStopIds = 4;

// The smallest power of two >= n (and >= 16).
int64_t RoundUp(int64_t n) {
  int64_t p = 16;
  while (p < n) p *= 2;
  return p;
}

void Synchronize(at::Device device) {
  // A host copy waits for the device's queued work.
  if (!device.is_cpu()) at::zeros({1}, at::TensorOptions().device(device)).item<int64_t>();
}

}  // namespace

absl::Status ValidateContinuousOptions(const ContinuousOptions& o) {
  if (o.max_running_sequences <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_running_sequences is ", o.max_running_sequences, "; it must be positive"));
  }
  for (const auto& [name, v] : {std::pair{"max_prompts", o.max_prompts},
                                {"prompt_capacity", o.prompt_capacity},
                                {"response_capacity", o.response_capacity},
                                {"stop_check_every", o.stop_check_every}}) {
    if (v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is ", v, "; it must be >= 0 (0: the default)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ContinuousEngine>> ContinuousEngine::Create(
    const PolicyModel* model, uint64_t version, ContinuousOptions options) {
  ASYMPO_RETURN_IF_ERROR(ValidateContinuousOptions(options));
  std::unique_ptr<ContinuousEngine> engine(new ContinuousEngine(model, version, options));
  if (options.prompt_capacity > 0 && options.response_capacity > 0) {
    ASYMPO_RETURN_IF_ERROR(GuardTorch("generation", [&]() -> absl::Status {
      engine->Allocate(options.prompt_capacity, options.response_capacity);
      return absl::OkStatus();
    }));
  }
  return engine;
}

ContinuousEngine::ContinuousEngine(const PolicyModel* model, uint64_t version,
                                   ContinuousOptions options)
    : model_(model), version_(version), options_(options) {
  slots_ = options_.max_running_sequences;
  prompts_ = options_.max_prompts > 0 ? options_.max_prompts : slots_;
  slot_.resize(static_cast<size_t>(slots_));
  prompt_row_.resize(static_cast<size_t>(prompts_));
}

int32_t ContinuousEngine::StopCheckEvery() const {
  if (options_.stop_check_every > 0) return options_.stop_check_every;
  return model_->options().device.is_cpu() ? 1 : 4;
}

absl::StatusOr<uint64_t> ContinuousEngine::Add(GenerationRequest request) {
  ASYMPO_RETURN_IF_ERROR(ValidateRequest(request, model_->config()));
  const int64_t len = static_cast<int64_t>(request.prompt.size());
  if (options_.prompt_capacity > 0 && len > options_.prompt_capacity) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", len,
                                                   " tokens) exceeds the engine's prompt_capacity ",
                                                   options_.prompt_capacity));
  }
  if (request.multi_turn) {
    if (request.response_budget < 0 ||
        (request.response_budget > 0 && request.response_budget < request.params.max_new_tokens)) {
      return absl::InvalidArgumentError(
          absl::StrCat("response_budget ", request.response_budget, " is below max_new_tokens ",
                       request.params.max_new_tokens, " (0: max_new_tokens)"));
    }
    if (len + request.response_budget > model_->config().max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt (", len, " tokens) plus response_budget (", request.response_budget,
          ") exceeds max_position_embeddings ", model_->config().max_position_embeddings));
    }
  }
  if (options_.response_capacity > 0 && ResponseNeed(request) > options_.response_capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        request.multi_turn ? "response_budget " : "max_new_tokens ", ResponseNeed(request),
        " exceeds the engine's response_capacity ", options_.response_capacity));
  }
  const uint64_t id = next_id_++;
  waiting_.push_back({id, std::move(request)});
  return id;
}

void ContinuousEngine::SetModel(const PolicyModel* model, uint64_t version) {
  if (version != version_) ++stats_.weight_swaps;
  model_ = model;
  version_ = version;
  c10::InferenceMode inference_mode;  // the engine's tensors are inference tensors
  if (version_now_.defined()) version_now_.fill_(static_cast<int64_t>(version));
}

void ContinuousEngine::Allocate(int64_t prompt_capacity, int64_t response_capacity) {
  c10::InferenceMode inference_mode;
  const auto on = at::TensorOptions().device(model_->options().device);
  const auto longs = on.dtype(at::kLong);
  const int64_t v = model_->config().vocab_size;
  graphs_.clear();
  prompt_capacity_ = prompt_capacity;
  response_capacity_ = response_capacity;
  cache_ = model_->NewSharedCache(prompts_, prompt_capacity, slots_, response_capacity);
  stats_.prompt_row_bytes = 0;
  for (const at::Tensor& t : cache_.prompts.keys)
    stats_.prompt_row_bytes += 2 * t.nbytes() / prompts_;
  sampler_ = std::make_unique<BatchSampler>(slots_, model_->options().device);
  prompt_logits_ = at::zeros({prompts_, v}, on.dtype(model_->compute_dtype()));
  logits_ = at::zeros({slots_, v}, on.dtype(model_->compute_dtype()));
  last_ = at::zeros({slots_}, longs);
  prompt_ = at::zeros({slots_}, longs);
  prompt_length_ = at::zeros({slots_}, longs);
  length_ = at::zeros({slots_}, longs);
  max_new_ = at::ones({slots_}, longs);
  stop_ids_ = at::full({slots_, kStopIds}, -1, longs);
  live_ = at::zeros({slots_}, on.dtype(at::kBool));
  tokens_ = at::full({slots_, response_capacity}, options_.pad_token_id, longs);
  logprobs_ = at::zeros({slots_, response_capacity}, on.dtype(at::kFloat));
  version_now_ = at::full({1}, static_cast<int64_t>(version_), longs);
  last_version_ = at::zeros({slots_}, longs);
}

int64_t ContinuousEngine::AcquirePromptRow(const std::vector<int32_t>& prompt) {
  if (options_.share_prompts) {
    auto it = row_of_prompt_.find(prompt);
    if (it != row_of_prompt_.end()) {
      ++prompt_row_[static_cast<size_t>(it->second)].users;
      return it->second;
    }
  }
  int64_t row = -1;
  for (int64_t r = 0; r < prompts_ && row < 0; ++r) {
    if (prompt_row_[static_cast<size_t>(r)].users == 0) row = r;
  }
  if (row < 0) return -1;
  const auto start = std::chrono::steady_clock::now();
  const auto device = model_->options().device;
  const int64_t n = static_cast<int64_t>(prompt.size());
  const at::Tensor ids =
      at::tensor(std::vector<int64_t>(prompt.begin(), prompt.end()), at::kLong).view({1, n});
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
  KvCache view = ::asympo::PromptRow(cache_, row);
  const at::Tensor hidden = model_->Forward(ids.to(device), at::arange(n, longs).view({1, n}),
                                            at::ones({1, n}, longs.dtype(at::kBool)), &view);
  prompt_logits_[row].copy_(model_->Logits(hidden.select(1, n - 1)).select(0, 0));
  Synchronize(device);
  stats_.prefill_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++stats_.prefills;
  stats_.prefill_tokens += n;
  HeldPrompt& pr = prompt_row_[static_cast<size_t>(row)];
  pr.users = 1;
  pr.tokens = prompt;
  if (options_.share_prompts) row_of_prompt_[prompt] = row;
  int64_t in_use = 0;
  for (const HeldPrompt& p : prompt_row_) in_use += p.users > 0 ? 1 : 0;
  stats_.prompt_rows_peak = std::max(stats_.prompt_rows_peak, in_use);
  return row;
}

void ContinuousEngine::ReleasePromptRow(int64_t row) {
  HeldPrompt& pr = prompt_row_[static_cast<size_t>(row)];
  if (--pr.users > 0) return;
  // Not kept for later requests: a later prompt would read keys and values
  // computed under weights older than it needs.
  if (options_.share_prompts) row_of_prompt_.erase(pr.tokens);
  pr.tokens.clear();
}

void ContinuousEngine::Admit() {
  while (!waiting_.empty() && running_ < slots_) {
    const GenerationRequest& r = waiting_.front().request;
    const int64_t len = static_cast<int64_t>(r.prompt.size());
    const int64_t new_tokens = ResponseNeed(r);
    if (len > prompt_capacity_ || new_tokens > response_capacity_) {
      if (running_ > 0) return;  // reallocated once the running ones finish
      int64_t pc = std::max<int64_t>(prompt_capacity_, len);
      int64_t rc = std::max<int64_t>(response_capacity_, new_tokens);
      for (const Waiting& w : waiting_) {  // every waiting request, at once
        pc = std::max<int64_t>(pc, static_cast<int64_t>(w.request.prompt.size()));
        rc = std::max<int64_t>(rc, ResponseNeed(w.request));
      }
      // Grown to a power of two: a few reallocations (each waits for the
      // running sequences to finish) however the lengths arrive.
      Allocate(options_.prompt_capacity > 0 ? options_.prompt_capacity : RoundUp(pc),
               options_.response_capacity > 0 ? options_.response_capacity : RoundUp(rc));
    }
    if (r.params.stop_token_ids.size() > static_cast<size_t>(stop_ids_.size(1))) {
      const int64_t k = static_cast<int64_t>(r.params.stop_token_ids.size());
      stop_ids_ = at::cat(
          {stop_ids_, at::full({slots_, k - stop_ids_.size(1)}, -1, stop_ids_.options())}, 1);
      graphs_.clear();
    }
    const int64_t row = AcquirePromptRow(r.prompt);
    if (row < 0) return;  // waits for a prompt row
    int64_t s = 0;
    while (slot_[static_cast<size_t>(s)].used) ++s;
    Slot& slot = slot_[static_cast<size_t>(s)];
    slot.used = true;
    slot.id = waiting_.front().id;
    slot.request = std::move(waiting_.front().request);
    slot.prompt_row = row;
    slot.first_version = version_;
    slot.budget = ResponseNeed(slot.request);
    waiting_.pop_front();
    ++running_;
    const SamplingParams& p = slot.request.params;
    sampler_->SetRow(s, p);
    any_logprobs_ = any_logprobs_ || p.return_logprobs;
    logits_[s].copy_(prompt_logits_[row]);
    prompt_[s].fill_(row);
    prompt_length_[s].fill_(len);
    length_[s].fill_(0);
    max_new_[s].fill_(static_cast<int64_t>(p.max_new_tokens));
    stop_ids_[s].fill_(-1);
    for (size_t j = 0; j < p.stop_token_ids.size(); ++j) {
      stop_ids_[s][static_cast<int64_t>(j)].fill_(static_cast<int64_t>(p.stop_token_ids[j]));
    }
    live_[s].fill_(true);
  }
}

void ContinuousEngine::DecodeStep() {
  const int32_t pad = options_.pad_token_id;
  const bool logprobs = any_logprobs_;
  // What an eager step attends to: the longest running prompt, and as many
  // response slots as the oldest running sequence can have filled.
  int64_t prompt_visible = 1, response_visible = 1;
  for (Slot& slot : slot_) {
    if (!slot.used) continue;
    prompt_visible = std::max<int64_t>(prompt_visible, slot.request.prompt.size());
    response_visible = std::max(response_visible, std::min(++slot.steps, response_capacity_));
  }
  const auto step = [this, pad, logprobs](int64_t prompt_visible, int64_t response_visible) {
    // Sample response token length_[s] of every live slot.
    const at::Tensor tok = at::where(live_, sampler_->Sample(logits_, length_),
                                     at::full({}, pad, length_.options()));  // (S,)
    const at::Tensor at_token = length_.clamp_max(response_capacity_ - 1).unsqueeze(1);
    tokens_.scatter_(1, at_token,
                     at::where(live_, tok, tokens_.gather(1, at_token).squeeze(1)).unsqueeze(1));
    if (logprobs) {
      const at::Tensor lp =
          at::log_softmax(logits_.to(at::kFloat), 1).gather(1, tok.unsqueeze(1)).squeeze(1);
      logprobs_.scatter_(
          1, at_token, at::where(live_, lp, logprobs_.gather(1, at_token).squeeze(1)).unsqueeze(1));
    }
    length_.add_(live_);
    last_version_.copy_(at::where(live_, version_now_, last_version_));
    last_.copy_(at::where(live_, tok, last_));
    const at::Tensor hit =
        at::logical_or((stop_ids_ == tok.unsqueeze(1)).any(1), length_ >= max_new_);
    live_.logical_and_(hit.logical_not());
    // Run the model on the token just sampled, at its response slot.
    const at::Tensor write = (length_ - 1).clamp_min(0);
    const at::Tensor hidden =
        model_->DecodeShared(last_.unsqueeze(1), (prompt_length_ + write).unsqueeze(1), prompt_,
                             prompt_length_, write, &cache_, prompt_visible, response_visible);
    logits_.copy_(model_->Logits(hidden.select(1, 0)));
  };
  const auto device = model_->options().device;
  const int path = sampler_->path() | (logprobs ? 8 : 0);
  if (path != graph_path_) {
    graphs_.clear();
    graph_path_ = path;
  }
  if (!(options_.cuda_graphs && device.is_cuda())) {
    step(prompt_visible, response_visible);
    return;
  }
  auto it = graphs_.find(model_);
  if (it == graphs_.end()) {
    // Runs the step once, then captures it; null where graphs are not
    // available (the step then runs eagerly for this model).
    graphs_[model_] = CaptureDecodeGraph([&] { step(-1, -1); }, device);
  } else if (it->second != nullptr) {
    it->second->Replay();
  } else {
    step(prompt_visible, response_visible);
  }
}

std::vector<ContinuousEngine::Finished> ContinuousEngine::Collect() {
  std::vector<Finished> out;
  const at::Tensor live_host = live_.to(at::kCPU);
  const auto live = live_host.accessor<bool, 1>();
  std::vector<int64_t> done;
  for (int64_t s = 0; s < slots_; ++s) {
    const Slot& slot = slot_[static_cast<size_t>(s)];
    if (slot.used && !slot.paused && !live[s]) done.push_back(s);
  }
  if (done.empty()) return out;
  const auto device = model_->options().device;
  const at::Tensor rows = at::tensor(done, at::kLong).to(device);
  const at::Tensor tokens = tokens_.index_select(0, rows).to(at::kCPU);
  const at::Tensor lengths = length_.index_select(0, rows).to(at::kCPU);
  const at::Tensor versions = last_version_.index_select(0, rows).to(at::kCPU);
  const at::Tensor logprobs =
      any_logprobs_ ? logprobs_.index_select(0, rows).to(at::kCPU) : at::Tensor();
  const auto len = lengths.accessor<int64_t, 1>();
  const auto ver = versions.accessor<int64_t, 1>();
  for (size_t i = 0; i < done.size(); ++i) {
    const int64_t s = done[i], k = static_cast<int64_t>(i);
    Slot& slot = slot_[static_cast<size_t>(s)];
    const int64_t n = len[k];
    if (slot.request.multi_turn) {
      out.push_back(Pause(s, tokens[k], logprobs.defined() ? logprobs[k] : at::Tensor(), n,
                          static_cast<uint64_t>(ver[k])));
      continue;
    }
    Finished f{slot.id, ResultOfRow(tokens[k], logprobs.defined() ? logprobs[k] : at::Tensor(), n,
                                    slot.request.params)};
    f.result.first_version = slot.first_version;
    f.result.last_version = static_cast<uint64_t>(ver[k]);
    stats_.generated_tokens += n;
    ++stats_.finished;
    ReleasePromptRow(slot.prompt_row);
    slot = Slot();
    prompt_length_[s].fill_(0);
    length_[s].fill_(0);
    --running_;
    out.push_back(std::move(f));
  }
  return out;
}

void ContinuousEngine::Reset() {
  waiting_.clear();
  for (Slot& s : slot_) s = Slot();
  for (HeldPrompt& p : prompt_row_) p = HeldPrompt();
  row_of_prompt_.clear();
  running_ = 0;
  paused_ = 0;
  c10::InferenceMode inference_mode;
  if (live_.defined()) live_.zero_();
  if (prompt_length_.defined()) prompt_length_.zero_();
}

absl::StatusOr<std::vector<ContinuousEngine::Finished>> ContinuousEngine::Step() {
  absl::StatusOr<std::vector<Finished>> out =
      GuardTorch("generation", [&]() -> absl::StatusOr<std::vector<Finished>> {
        // No autograd bookkeeping at all: small decode steps are dominated
        // by per-operator overhead.
        c10::InferenceMode inference_mode;
        Admit();
        if (running_ == paused_) return std::vector<Finished>();  // none decoding
        DecodeStep();
        ++stats_.decode_steps;
        stats_.slot_steps_used += running_;
        if (++steps_since_check_ < StopCheckEvery()) return std::vector<Finished>();
        steps_since_check_ = 0;
        return Collect();
      });
  if (!out.ok()) Reset();
  return out;
}

absl::StatusOr<std::vector<GenerationResult>> ContinuousEngine::Generate(
    const std::vector<GenerationRequest>& requests) {
  if (!idle()) return absl::FailedPreconditionError("Generate needs an idle engine");
  std::vector<GenerationResult> results(requests.size());
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < requests.size(); ++i) {
    absl::StatusOr<uint64_t> id = Add(requests[i]);
    if (!id.ok()) {
      Reset();
      return absl::InvalidArgumentError(absl::StrCat("request ", i, ": ", id.status().message()));
    }
    ids.push_back(*id);
  }
  const uint64_t first = ids.empty() ? 0 : ids.front();
  while (!idle()) {
    ASYMPO_ASSIGN_OR_RETURN(std::vector<Finished> finished, Step());
    for (Finished& f : finished) results[f.id - first] = std::move(f.result);
  }
  return results;
}

}  // namespace asympo::rollout

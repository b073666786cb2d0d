// Continuous batching: sampling as an inference server does it.
//
// Up to max_running_sequences sequences decode together, one token per
// step, each in a slot of its own. When a sequence finishes, its slot takes
// the next waiting request at the next step; the others never move. The G
// requests of one prompt share that prompt's keys and values: the prompt is
// pre-filled once into a row of a prompt pool and every sequence that
// continues it reads that row (PolicyModel::DecodeShared), so prefill time
// and prompt KV memory fall by G.
//
// KV memory is laid out per slot, not in paged blocks: a slot's response
// has a region of response_capacity positions and a prompt row has
// prompt_capacity (docs/model.md says why). A decode step has static shapes
// over every slot, used or not, and on a CUDA device it is captured once
// per model as a CUDA graph and replayed.
//
// Sampling is per request and seeded as in GenerationEngine (sampling.h):
// a request's tokens depend only on its prompt, its parameters (seed
// included) and the weights, not on what runs beside it.
//
// Weights can change between two steps (SetModel): running sequences go on
// under the new weights, keeping the keys and values computed under the
// old ones (in-flight weight updates). Each result says which versions
// sampled its first and its last token.
//
// Multi-turn requests (GenerationRequest::multi_turn) pause at the end of
// each turn, keeping their slot and their keys and values, and come back
// from Step as paused. Resume appends an environment's tokens and decodes
// the next turn: only the appended tokens are pre-filled (reuse_kv; false
// recomputes the whole response, for comparison). End frees the slot.
//
// Not thread-safe: one thread drives an engine.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/statusor.h"
#include "common/model/policy_model.h"
#include "rollout_server/engine/decode_graph.h"
#include "rollout_server/engine/generation.h"
#include "rollout_server/engine/sampling.h"

namespace asympo::rollout {

struct ContinuousOptions {
  // Sequences decoding at once (slots).
  int32_t max_running_sequences = 64;
  // Prompt rows kept at once; 0: max_running_sequences (enough when no two
  // running sequences share a prompt). With groups of G, about
  // max_running_sequences / G + 1 suffice; a request whose prompt finds no
  // free row waits for one.
  int32_t max_prompts = 0;
  // Longest prompt and most new tokens a request may have: the sizes of the
  // cache's rows. 0: grown as requests need (to a power of two, at least
  // 16); a request that does not fit waits until no sequence is running,
  // and the cache is reallocated.
  int32_t prompt_capacity = 0;
  int32_t response_capacity = 0;
  // Requests with identical prompts share one prefill and one prompt row
  // while any of them runs; false gives every request its own.
  bool share_prompts = true;
  int32_t pad_token_id = 0;
  // Replay the decode step as a CUDA graph on a CUDA device (decode_graph.h).
  bool cuda_graphs = true;
  // Decode steps between two looks at which sequences finished (a host
  // synchronisation); 0: 1 on the CPU, 4 on a GPU. A finished sequence's
  // slot stays idle until the next look.
  int32_t stop_check_every = 0;
  // Multi-turn: Resume pre-fills only the appended tokens (true), or the
  // whole response so far with them (false: what an engine without the
  // sequence's cache would do; the prompt's row is kept either way).
  bool reuse_kv = true;
};

absl::Status ValidateContinuousOptions(const ContinuousOptions& options);

// What an engine has done so far (for benchmarks and metrics).
struct ContinuousStats {
  int64_t decode_steps = 0;
  int64_t prefills = 0;          // prompts pre-filled
  int64_t prefill_tokens = 0;    // their tokens
  double prefill_seconds = 0;    // wall time of the prefills (synchronised)
  int64_t generated_tokens = 0;  // tokens of finished requests
  int64_t finished = 0;
  int64_t weight_swaps = 0;      // SetModel calls that changed the version
  int64_t prompt_rows_peak = 0;  // most prompt rows in use at once
  int64_t prompt_row_bytes = 0;  // KV bytes of one prompt row
  int64_t slot_steps_used = 0;   // sum over steps of sequences running
  int64_t resumes = 0;           // multi-turn sequences resumed
  int64_t resume_tokens = 0;     // tokens they pre-filled
  double resume_seconds = 0;     // wall time of those pre-fills (synchronised)
};

class ContinuousEngine {
 public:
  // `model` must outlive its use (until SetModel replaces it); `version` is
  // its policy version.
  static absl::StatusOr<std::unique_ptr<ContinuousEngine>> Create(const PolicyModel* model,
                                                                  uint64_t version,
                                                                  ContinuousOptions options);

  // Queues a request; returns its id (increasing from 0). INVALID_ARGUMENT
  // as GenerationEngine::Generate, or for a request beyond a fixed
  // prompt_capacity/response_capacity.
  absl::StatusOr<uint64_t> Add(GenerationRequest request);

  struct Finished {
    uint64_t id = 0;
    // The whole response so far (a paused request's: every turn and every
    // inserted token).
    GenerationResult result;
    // A multi-turn request at the end of a turn: it holds its slot until
    // Resume or End.
    bool paused = false;
  };
  // Admits waiting requests into free slots (pre-filling prompts not yet
  // held), runs one decode step, and returns the requests found finished.
  // An error from LibTorch (out of memory, say) is a status naming
  // "generation"; the engine is then empty (every request dropped).
  absl::StatusOr<std::vector<Finished>> Step();

  // Between two steps: later tokens are sampled with `model` (the same
  // architecture), which is policy version `version`. Running sequences keep
  // their keys and values.
  void SetModel(const PolicyModel* model, uint64_t version);

  // A paused request goes on: `append` (inserted tokens, possibly none) is
  // added to its response and up to `max_new_tokens` more are decoded
  // (within its response_budget). INVALID_ARGUMENT for an id that is not
  // paused, a token outside the vocabulary, or a response that would leave
  // no room for one generated token; the request stays paused then.
  absl::Status Resume(uint64_t id, const std::vector<int32_t>& append, int32_t max_new_tokens);
  // A paused request ends: its slot is freed. NOT_FOUND when not paused.
  absl::Status End(uint64_t id);

  // Requests holding a slot (decoding or paused), and those paused.
  int64_t running() const { return running_; }
  int64_t paused() const { return paused_; }
  // Whether Step would decode: a request is decoding, or one waits and a
  // slot is free for it.
  bool can_decode() const { return running_ > paused_ || (!waiting_.empty() && running_ < slots_); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  bool idle() const { return running_ == 0 && waiting_.empty(); }
  uint64_t version() const { return version_; }
  const ContinuousStats& stats() const { return stats_; }
  const ContinuousOptions& options() const { return options_; }

  // Adds every request and steps until all have finished; results in
  // request order. The engine must be idle.
  absl::StatusOr<std::vector<GenerationResult>> Generate(
      const std::vector<GenerationRequest>& requests);

 private:
  struct Waiting {
    uint64_t id;
    GenerationRequest request;
  };
  struct Slot {
    bool used = false;
    uint64_t id = 0;
    GenerationRequest request;
    int64_t prompt_row = -1;
    uint64_t first_version = 0;
    int64_t steps = 0;  // decode steps since admission: >= its response tokens
    // Multi-turn: paused, and the response so far (a host copy at the
    // pause) with its mask; the most response tokens.
    bool paused = false;
    std::vector<int32_t> tokens;
    std::vector<bool> mask;
    int64_t budget = 0;
  };
  struct HeldPrompt {
    int64_t users = 0;
    std::vector<int32_t> tokens;
  };

  ContinuousEngine(const PolicyModel* model, uint64_t version, ContinuousOptions options);
  // (Re)allocates the cache and the slots' tensors for the capacities.
  void Allocate(int64_t prompt_capacity, int64_t response_capacity);
  // Moves waiting requests into free slots while they fit (may throw).
  void Admit();
  // A prompt row holding `prompt` (pre-filled now if new), or -1 when none
  // is free.
  int64_t AcquirePromptRow(const std::vector<int32_t>& prompt);
  void ReleasePromptRow(int64_t row);
  // Samples every running sequence's next token and runs the model on it
  // (graph-captured on CUDA over the whole cache; eagerly over the filled
  // part); no host synchronisation.
  void DecodeStep();
  // The finished sequences, their slots freed (a host synchronisation).
  std::vector<Finished> Collect();
  // Collect's result for a multi-turn slot: paused, the slot kept.
  Finished Pause(int64_t s, const at::Tensor& tokens, const at::Tensor& logprobs, int64_t n,
                 uint64_t last_version);
  // The slot of paused request `id`, or -1.
  int64_t PausedSlot(uint64_t id) const;
  // Resume's pre-fill: `ids` at the slot's response positions from `start`,
  // leaving the logits after the last.
  void Prefill(int64_t s, const std::vector<int32_t>& ids, int64_t start);
  // The response capacity a request needs.
  static int64_t ResponseNeed(const GenerationRequest& r);
  void Reset();
  int32_t StopCheckEvery() const;

  const PolicyModel* model_;
  uint64_t version_;
  ContinuousOptions options_;
  int64_t slots_ = 0, prompts_ = 0;
  int64_t prompt_capacity_ = 0, response_capacity_ = 0;
  std::deque<Waiting> waiting_;
  std::vector<Slot> slot_;
  std::vector<HeldPrompt> prompt_row_;
  std::map<std::vector<int32_t>, int64_t> row_of_prompt_;
  int64_t running_ = 0;
  int64_t paused_ = 0;
  uint64_t next_id_ = 0;
  int64_t steps_since_check_ = 0;
  ContinuousStats stats_;

  // Device state, static shapes over the slots (S) and prompt rows (P).
  SharedPrefixCache cache_;
  std::unique_ptr<BatchSampler> sampler_;
  at::Tensor prompt_logits_;  // (P, V): the logits after each prompt
  at::Tensor logits_;         // (S, V): each slot's next-token logits
  at::Tensor last_;           // (S,) int64: the token just sampled
  at::Tensor prompt_;         // (S,) int64: the slot's prompt row
  at::Tensor prompt_length_;  // (S,) int64 (0 when free)
  at::Tensor length_;         // (S,) int64: response tokens so far
  at::Tensor max_new_;        // (S,) int64
  at::Tensor stop_ids_;       // (S, K) int64, -1 padded
  at::Tensor live_;           // (S,) bool: in use and not finished
  at::Tensor tokens_;         // (S, response capacity) int64
  at::Tensor logprobs_;       // (S, response capacity) float32
  at::Tensor version_now_;    // (1,) int64: version_
  at::Tensor last_version_;   // (S,) int64: the version of the last token
  bool any_logprobs_ = false;
  // Captured steps per model (a double-buffered policy alternates two),
  // valid while the sampler's path is unchanged.
  std::map<const PolicyModel*, std::unique_ptr<DecodeGraph>> graphs_;
  int graph_path_ = -1;
};

}  // namespace asympo::rollout

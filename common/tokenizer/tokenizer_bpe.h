// The byte-level BPE model of a tokenizer.json ("model": {"type": "BPE"}):
// the vocabulary, the ranked merges, and the merge loop that turns the bytes
// of one pre-token into token ids.
//
// Internal to common/tokenizer/tokenizer.h. Thread-safe: Tokenize may be called from
// many threads; its word cache is guarded by a mutex.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/tokenizer/tokenizer_json.h"
#include "nlohmann/json.hpp"

namespace asympo {
namespace tokenizer_internal {

class BpeModel {
 public:
  // Words up to this many bytes are cached, and at most kCacheCapacity of
  // them; once full the cache stops growing (the first words seen in a corpus
  // are its most frequent).
  static constexpr size_t kMaxCachedWordBytes = 64;
  static constexpr size_t kCacheCapacity = 50000;

  // Builds the model from the "model" object of a tokenizer.json and its
  // vocab and merges, read by ParseTokenizerJson. Errors
  // (INVALID_ARGUMENT) name the field and the rule: a model type other than
  // BPE, dropout, byte_fallback, subword prefixes/suffixes, a merge whose
  // parts or result are not in the vocabulary, a byte missing from the
  // vocabulary without an unk_token.
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model,
                                                            BpeTables tables);

  // Appends the ids of one pre-token, given as raw bytes, to `ids`.
  void Tokenize(absl::string_view word, std::vector<int32_t>* ids) const;

  // Token (byte-level spelling, e.g. "Ġthe") -> id.
  const absl::flat_hash_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct MergeRule {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  BpeModel() = default;
  absl::Status AddMerge(absl::string_view left, absl::string_view right, int32_t rank);
  void MergeWord(absl::string_view word, std::vector<int32_t>* ids) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, MergeRule> merges_;
  // Id of the single-byte token of each byte; -1 when absent (then unk_id_).
  std::array<int32_t, 256> byte_ids_{};
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace tokenizer_internal
}  // namespace asympo

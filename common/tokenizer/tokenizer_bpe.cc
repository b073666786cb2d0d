#include "common/tokenizer/tokenizer_bpe.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer_json.h"
#include "common/tokenizer/tokenizer_text.h"

namespace asympo {
namespace tokenizer_internal {
namespace {

std::string Quoted(absl::string_view s) { return absl::StrCat("\"", absl::CHexEscape(s), "\""); }

absl::Status Unsupported(absl::string_view field, absl::string_view value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat("model.", field, " is ", value, "; ", rule));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const nlohmann::json& model,
                                                             BpeTables tables) {
  if (!model.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model is ", model.type_name(), "; it must be an object"));
  }
  const std::string type = TypeOf(model);
  if (!type.empty() && type != "BPE") {
    return Unsupported("type", Quoted(type), "only \"BPE\" models are supported");
  }
  auto model_ptr = std::unique_ptr<BpeModel>(new BpeModel);
  BpeModel& m = *model_ptr;

  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) {
      return Unsupported("dropout", it->dump(), "BPE dropout is not supported (use null)");
    }
  }
  bool byte_fallback = false;
  ASYMPO_RETURN_IF_ERROR(ReadBool(model, "byte_fallback", "model", &byte_fallback));
  if (byte_fallback) {
    return Unsupported("byte_fallback", "true",
                       "byte fallback (SentencePiece-style BPE) is not supported; "
                       "only byte-level BPE is");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    std::string value;
    ASYMPO_RETURN_IF_ERROR(ReadString(model, key, "model", &value));
    if (!value.empty()) {
      return Unsupported(key, Quoted(value), "byte-level BPE supports only an empty affix");
    }
  }
  ASYMPO_RETURN_IF_ERROR(ReadBool(model, "fuse_unk", "model", &m.fuse_unk_));
  ASYMPO_RETURN_IF_ERROR(ReadBool(model, "ignore_merges", "model", &m.ignore_merges_));

  if (!tables.has_vocab) {
    return absl::InvalidArgumentError(
        "model.vocab is missing or not an object; it must map each token to its id");
  }
  m.vocab_ = std::move(tables.vocab);

  std::string unk;
  ASYMPO_RETURN_IF_ERROR(ReadString(model, "unk_token", "model", &unk));
  if (!unk.empty()) {
    auto it = m.vocab_.find(unk);
    if (it == m.vocab_.end()) {
      return Unsupported("unk_token", Quoted(unk), "the unknown token must be in model.vocab");
    }
    m.unk_id_ = it->second;
  }

  // Every byte needs a token, or the unknown token stands in for it.
  for (int b = 0; b < 256; ++b) {
    const std::string symbol = BytesToByteLevel(std::string(1, static_cast<char>(b)));
    auto it = m.vocab_.find(symbol);
    m.byte_ids_[b] = it == m.vocab_.end() ? -1 : it->second;
    if (m.byte_ids_[b] < 0 && !m.unk_id_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "model.vocab has no token for byte 0x%02X (%s) and model.unk_token is null; a "
          "byte-level vocabulary must cover all 256 bytes",
          b, Quoted(symbol)));
    }
  }

  // Merges, in rank order.
  if (!tables.has_merges) {
    return absl::InvalidArgumentError("model.merges is missing or not an array");
  }
  m.merges_.reserve(tables.merges.size());
  for (size_t rank = 0; rank < tables.merges.size(); ++rank) {
    ASYMPO_RETURN_IF_ERROR(m.AddMerge(tables.merges[rank].first, tables.merges[rank].second,
                                      static_cast<int32_t>(rank)));
  }
  return model_ptr;
}

absl::Status BpeModel::AddMerge(absl::string_view left, absl::string_view right, int32_t rank) {
  auto find = [&](absl::string_view token) -> absl::StatusOr<int32_t> {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.merges[", rank, "] (", Quoted(left), ", ", Quoted(right), "): ", Quoted(token),
          " is not in model.vocab; both parts of a merge and its result must be"));
    }
    return it->second;
  };
  ASYMPO_ASSIGN_OR_RETURN(const int32_t left_id, find(left));
  ASYMPO_ASSIGN_OR_RETURN(const int32_t right_id, find(right));
  ASYMPO_ASSIGN_OR_RETURN(const int32_t merged_id, find(absl::StrCat(left, right)));
  // A repeated pair keeps its last rank, as Hugging Face's loader does.
  merges_[PairKey(left_id, right_id)] = MergeRule{rank, merged_id};
  return absl::OkStatus();
}

void BpeModel::Tokenize(absl::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (word.size() == 1 && byte_ids_[static_cast<unsigned char>(word[0])] >= 0) {
    ids->push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  MergeWord(word, ids);
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() < kCacheCapacity) {
      cache_.emplace(word, std::vector<int32_t>(ids->begin() + first, ids->end()));
    }
  }
}

void BpeModel::MergeWord(absl::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges_) {
    auto it = vocab_.find(BytesToByteLevel(word));
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  // A doubly linked list of symbols indexed by the byte they start at; a
  // merged-away symbol gets id -1.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (char c : word) {
    int32_t id = byte_ids_[static_cast<unsigned char>(c)];
    if (id < 0) {
      id = *unk_id_;  // FromJson guarantees an unknown token here.
      if (fuse_unk_ && !symbols.empty() && symbols.back().id == id) continue;
    }
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, n - 1, n + 1});
  }
  symbols.back().next = -1;

  // Candidate merges, lowest rank first and, among equal ranks (the same pair
  // in several places), leftmost first.
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left;
    int32_t right;
    int32_t merged;
  };
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::vector<Candidate> heap;
  auto push = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it == merges_.end()) return;
    heap.push_back(
        Candidate{it->second.rank, pos, symbols[pos].id, symbols[next].id, it->second.merged_id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.pos];
    // Stale when either side has merged since: a symbol's id only changes
    // by growing, so matching ids mean the same pair at the same place.
    if (left.id != c.left || left.next < 0 || symbols[left.next].id != c.right) continue;
    Symbol& right = symbols[left.next];
    left.id = c.merged;
    left.next = right.next;
    right.id = -1;
    if (left.next >= 0) symbols[left.next].prev = c.pos;
    if (left.prev >= 0) push(left.prev);
    if (left.next >= 0) push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace tokenizer_internal
}  // namespace asympo

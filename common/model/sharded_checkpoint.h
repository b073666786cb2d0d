// The state files of a learner checkpoint written by every rank in parallel,
// and the reader that any world resumes from, each rank reading only the
// byte ranges it needs (learner_server/trainer/checkpoint.h writes and
// commits them; docs/operations.md, "Checkpoints", describes the layout for
// operators).
//
// A checkpoint directory holds, beside meta.json:
//  - shard-RRRRR-of-WWWWW.safetensors, one per writing rank: pieces of the
//    weights and AdamW moments, each a 1-D run of elements [begin, end) of
//    one parameter's flattened weight or moment, named
//    "<kind>/<parameter>/<begin>" (kind: weight, exp_avg, exp_avg_sq); rank
//    0's also holds the CPU generator's state (__rng_state__);
//  - manifest.json: the layout: the writers' world size and sharding mode,
//    every parameter (name, shape, whether it has moments), and every file's
//    pieces with the CRC-32C of each block of kBlockBytes of their data.
//    meta.json's "crc32c" is the manifest's CRC; "layout" is "sharded".
// While a save runs, each rank also leaves shard-RRRRR.json (its pieces and
// their CRCs) for rank 0 to merge; they stay as written.
//
// Checkpoints written before this layout (state.safetensors: every weight
// under its own name, the moments as "__optimizer__.exp_avg.<i>" by
// parameter index; meta.json's "crc32c" that of the whole file) are read
// through the same reader.
//
// Functions are thread-compatible; a reader belongs to one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asympo {

class SafetensorsFile;

inline constexpr char kCheckpointManifestFile[] = "manifest.json";

enum class StateKind { kWeight = 0, kExpAvg = 1, kExpAvgSq = 2 };
// "weight", "exp_avg", "exp_avg_sq".
absl::string_view StateKindName(StateKind kind);

// One parameter as a checkpoint names it.
struct CheckpointParam {
  std::string name;
  std::vector<int64_t> shape;
  bool moments = false;  // the optimizer has stepped it (both moments exist)
  int64_t numel() const;
};

// Elements [begin, begin + data.numel()) of parameter `param`'s flattened
// weight or moment.
struct StatePiece {
  StateKind kind = StateKind::kWeight;
  size_t param = 0;  // its index in the parameter list
  int64_t begin = 0;
  at::Tensor data;  // 1-D; any device and dtype
};

// A shard file's name: shard-00001-of-00003.safetensors; and its index's,
// which rank 0 merges into the manifest: shard-00001.json.
std::string CheckpointShardFileName(int rank, int world);
std::string CheckpointShardIndexName(int rank);

// Writes rank `rank`'s part into `dir`: its shard file (the pieces, and
// `rng` when defined), then shard-RRRRR.json with the pieces' block CRCs,
// computed from what was written. INVALID_ARGUMENT for a piece outside its
// parameter; INTERNAL for I/O errors.
absl::Status WriteCheckpointShard(const std::string& dir, int rank, int world,
                                  const std::vector<CheckpointParam>& params,
                                  const std::vector<StatePiece>& pieces, const at::Tensor& rng);

// Rank 0, after every rank wrote its part: merges the `world` indexes into
// manifest.json (written atomically) and returns the manifest's CRC-32C.
// DATA_LOSS names a rank whose index is missing or unreadable.
absl::StatusOr<uint32_t> WriteCheckpointManifest(const std::string& dir, int world,
                                                 const std::string& dist_shard,
                                                 const std::vector<CheckpointParam>& params);

class CheckpointStateReader {
 public:
  // `dir` of either layout. `meta_crc`: meta.json's "crc32c" (the
  // manifest's, or the old state file's). `param_order`: the model's
  // parameter names in order (the old layout names moments by index).
  // DATA_LOSS for a manifest that does not match its CRC or is malformed, a
  // missing file, or a file of another size than the manifest says.
  static absl::StatusOr<std::unique_ptr<CheckpointStateReader>> Open(
      const std::string& dir, uint32_t meta_crc, const std::vector<std::string>& param_order);
  ~CheckpointStateReader();

  const std::vector<CheckpointParam>& params() const { return params_; }
  // The writers' world size and sharding mode (1, "none" for the old
  // layout).
  int world_size() const { return world_size_; }
  const std::string& dist_shard() const { return dist_shard_; }
  // The parameter named `name`; nullptr when the checkpoint has none.
  const CheckpointParam* Find(const std::string& name) const;

  // Checks that elements [begin, begin + length) of `name`'s `kind` are
  // all in the checkpoint and that the blocks holding them match their
  // CRC-32C (reading those blocks; each is checked once). DATA_LOSS names
  // the file, the piece and the block.
  absl::Status Verify(StateKind kind, const std::string& name, int64_t begin, int64_t length);
  // Copies them into `dest` (1-D, any device and dtype). Verify first:
  // Read checks coverage, not CRCs.
  absl::Status Read(StateKind kind, const std::string& name, int64_t begin, at::Tensor dest);
  // The CPU generator's state, checked against its CRC-32C; undefined when
  // the checkpoint has none.
  absl::StatusOr<at::Tensor> Rng();
  // Bytes read from the shard files so far (both passes).
  int64_t bytes_read() const { return bytes_read_; }

 private:
  struct Piece {
    StateKind kind;
    int64_t begin = 0, end = 0;
    size_t file = 0;
    std::string key;
    uint64_t offset = 0;  // of its data in the file
    size_t element_bytes = 0;
    at::ScalarType dtype;
    std::vector<uint32_t> crcs;  // per block; empty: the file's CRC covers it
  };
  struct File {
    std::string path;
    std::unique_ptr<SafetensorsFile> header;
    int fd = -1;
  };

  CheckpointStateReader() = default;
  absl::Status OpenManifest(const std::string& dir, uint32_t meta_crc);
  absl::Status OpenOldLayout(const std::string& dir, uint32_t meta_crc,
                             const std::vector<std::string>& param_order);
  absl::Status AddFile(const std::string& path, uint64_t expected_bytes);
  absl::Status Locate(Piece* piece, size_t file);
  // The pieces of `name`'s `kind` overlapping [begin, end), in order;
  // DATA_LOSS when they do not cover it.
  absl::StatusOr<std::vector<const Piece*>> Cover(StateKind kind, const std::string& name,
                                                  int64_t begin, int64_t end) const;
  absl::Status PRead(const File& file, uint64_t offset, size_t bytes, void* out);
  absl::Status VerifyBlock(const Piece& piece, size_t block);
  absl::Status VerifyOldFile();

  std::string dir_;
  std::vector<CheckpointParam> params_;
  std::map<std::string, size_t> param_index_;
  // Per parameter and kind: its pieces, by begin.
  std::map<std::pair<std::string, int>, std::vector<Piece>> pieces_;
  std::vector<File> files_;
  std::set<std::pair<const Piece*, size_t>> verified_;
  int world_size_ = 1;
  std::string dist_shard_ = "none";
  int64_t block_bytes_ = 0;
  uint32_t old_crc_ = 0;  // the old layout's whole-file CRC, to check once
  bool old_checked_ = false;
  std::string rng_key_;
  size_t rng_file_ = 0;
  uint32_t rng_crc_ = 0;
  int64_t bytes_read_ = 0;
};

// A checkpoint's weights, whole, by parameter name in the checkpoint's
// order (tools that only read the weights: asympo-eval). Verified.
absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ReadCheckpointWeights(
    CheckpointStateReader& reader);

}  // namespace asympo

#include "common/model/sharded_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include <ATen/ATen.h>
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/model/checkpoint_files.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_io.h"
#include "common/status_macros.h"

namespace asympo {
namespace {

// The CRC granularity: a reader that needs a few elements reads at most
// one block more on either side.
constexpr int64_t kBlockBytes = int64_t{4} << 20;
constexpr int kFormat = 1;

std::string PieceKey(StateKind kind, const std::string& param, int64_t begin) {
  return absl::StrCat(StateKindName(kind), "/", param, "/", begin);
}

absl::StatusOr<StateKind> KindOf(const std::string& name) {
  for (StateKind k : {StateKind::kWeight, StateKind::kExpAvg, StateKind::kExpAvgSq}) {
    if (StateKindName(k) == name) return k;
  }
  return absl::DataLossError(absl::StrCat("unknown state kind \"", name, "\""));
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  ASYMPO_ASSIGN_OR_RETURN(std::shared_ptr<FileMapping> m, FileMapping::Open(path));
  return std::string(reinterpret_cast<const char*>(m->data()), m->size());
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> w, AtomicFileWriter::Create(path));
  ASYMPO_RETURN_IF_ERROR(w->Append(text));
  return w->Commit();
}

// The CRC-32C of each kBlockBytes block of bytes [offset, offset + n) of
// the file `fd`, read back after the write.
absl::StatusOr<std::vector<uint32_t>> BlockCrcs(int fd, const std::string& path, uint64_t offset,
                                                uint64_t n, std::vector<char>* buffer) {
  std::vector<uint32_t> crcs;
  for (uint64_t at = 0; at < n; at += kBlockBytes) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kBlockBytes, n - at));
    buffer->resize(len);
    size_t done = 0;
    while (done < len) {
      const ssize_t r =
          ::pread(fd, buffer->data() + done, len - done, static_cast<off_t>(offset + at + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return absl::InternalError(absl::StrCat("cannot read back ", path));
      done += static_cast<size_t>(r);
    }
    crcs.push_back(Crc32c(buffer->data(), len));
  }
  return crcs;
}

}  // namespace

absl::string_view StateKindName(StateKind kind) {
  switch (kind) {
    case StateKind::kWeight:
      return "weight";
    case StateKind::kExpAvg:
      return "exp_avg";
    case StateKind::kExpAvgSq:
      return "exp_avg_sq";
  }
  return "?";
}

int64_t CheckpointParam::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string CheckpointShardIndexName(int rank) { return absl::StrFormat("shard-%05d.json", rank); }

std::string CheckpointShardFileName(int rank, int world) {
  return absl::StrFormat("shard-%05d-of-%05d.safetensors", rank, world);
}

absl::Status WriteCheckpointShard(const std::string& dir, int rank, int world,
                                  const std::vector<CheckpointParam>& params,
                                  const std::vector<StatePiece>& pieces, const at::Tensor& rng) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const StatePiece& p : pieces) {
    if (p.param >= params.size() || p.begin < 0 || p.data.dim() != 1 ||
        p.begin + p.data.numel() > params[p.param].numel()) {
      return absl::InvalidArgumentError(absl::StrCat("a ", StateKindName(p.kind), " piece at ",
                                                     p.begin, " lies outside its parameter"));
    }
    if (p.data.numel() == 0) continue;
    tensors.emplace_back(PieceKey(p.kind, params[p.param].name, p.begin), p.data);
  }
  if (rng.defined()) tensors.emplace_back(kCheckpointRngTensor, rng);
  const std::string name = CheckpointShardFileName(rank, world);
  const std::string path = dir + "/" + name;
  ASYMPO_RETURN_IF_ERROR(WriteSafetensors(path, tensors));
  ASYMPO_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path, " to read it back"));
  nlohmann::json index;
  index["file"] = name;
  index["bytes"] = file->file_size();
  index["pieces"] = nlohmann::json::array();
  std::vector<char> buffer;
  absl::Status status;
  for (const StatePiece& p : pieces) {
    if (p.data.numel() == 0) continue;
    const std::string key = PieceKey(p.kind, params[p.param].name, p.begin);
    const SafetensorsTensorInfo* info = file->Find(key);
    absl::StatusOr<std::vector<uint32_t>> crcs =
        BlockCrcs(fd, path, file->data_start() + info->begin, info->nbytes(), &buffer);
    if (!crcs.ok()) {
      status = crcs.status();
      break;
    }
    index["pieces"].push_back({{"param", params[p.param].name},
                               {"kind", StateKindName(p.kind)},
                               {"begin", p.begin},
                               {"end", p.begin + p.data.numel()},
                               {"key", key},
                               {"crc32c", *crcs}});
  }
  ::close(fd);
  ASYMPO_RETURN_IF_ERROR(status);
  if (rng.defined()) {
    const at::Tensor bytes = rng.contiguous().cpu();
    index["rng"] = kCheckpointRngTensor;
    index["rng_crc32c"] = Crc32c(bytes.data_ptr(), static_cast<size_t>(bytes.nbytes()));
  }
  return WriteText(dir + "/" + CheckpointShardIndexName(rank), index.dump() + "\n");
}

absl::StatusOr<uint32_t> WriteCheckpointManifest(const std::string& dir, int world,
                                                 const std::string& dist_shard,
                                                 const std::vector<CheckpointParam>& params) {
  nlohmann::json manifest;
  manifest["format"] = kFormat;
  manifest["world_size"] = world;
  manifest["dist_shard"] = dist_shard;
  manifest["block_bytes"] = kBlockBytes;
  manifest["params"] = nlohmann::json::array();
  for (const CheckpointParam& p : params) {
    manifest["params"].push_back({{"name", p.name}, {"shape", p.shape}, {"moments", p.moments}});
  }
  manifest["files"] = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<std::string> text = ReadText(dir + "/" + CheckpointShardIndexName(r));
    nlohmann::json index =
        text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
    if (!index.is_object() || !index.contains("pieces")) {
      return absl::DataLossError(absl::StrCat("rank ", r, "'s part of the checkpoint in ", dir,
                                              " has no readable index (",
                                              CheckpointShardIndexName(r), ")"));
    }
    manifest["files"].push_back(std::move(index));
  }
  const std::string text = manifest.dump() + "\n";
  ASYMPO_RETURN_IF_ERROR(WriteText(dir + "/" + kCheckpointManifestFile, text));
  return Crc32c(text.data(), text.size());
}

CheckpointStateReader::~CheckpointStateReader() {
  for (File& f : files_) {
    if (f.fd >= 0) ::close(f.fd);
  }
}

absl::StatusOr<std::unique_ptr<CheckpointStateReader>> CheckpointStateReader::Open(
    const std::string& dir, uint32_t meta_crc, const std::vector<std::string>& param_order) {
  std::unique_ptr<CheckpointStateReader> r(new CheckpointStateReader());
  r->dir_ = dir;
  if (::access((dir + "/" + kCheckpointManifestFile).c_str(), F_OK) == 0) {
    ASYMPO_RETURN_IF_ERROR(r->OpenManifest(dir, meta_crc));
  } else {
    ASYMPO_RETURN_IF_ERROR(r->OpenOldLayout(dir, meta_crc, param_order));
  }
  for (size_t i = 0; i < r->params_.size(); ++i) r->param_index_[r->params_[i].name] = i;
  for (auto& [key, list] : r->pieces_) {
    std::sort(list.begin(), list.end(),
              [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  }
  return r;
}

absl::Status CheckpointStateReader::AddFile(const std::string& path, uint64_t expected_bytes) {
  File f;
  f.path = path;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> header = SafetensorsFile::Open(path);
  if (!header.ok()) return absl::DataLossError(std::string(header.status().message()));
  f.header = *std::move(header);
  if (expected_bytes != 0 && f.header->file_size() != expected_bytes) {
    return absl::DataLossError(absl::StrCat(path, " has ", f.header->file_size(),
                                            " bytes; the manifest says ", expected_bytes));
  }
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) return absl::DataLossError(absl::StrCat("cannot open ", path));
  files_.push_back(std::move(f));
  return absl::OkStatus();
}

absl::Status CheckpointStateReader::Locate(Piece* piece, size_t file) {
  const SafetensorsFile& h = *files_[file].header;
  const SafetensorsTensorInfo* info = h.Find(piece->key);
  if (info == nullptr) {
    return absl::DataLossError(absl::StrCat(h.path(), " has no piece \"", piece->key, "\""));
  }
  ASYMPO_ASSIGN_OR_RETURN(piece->dtype, SafetensorsDtypeToScalarType(info->dtype));
  piece->file = file;
  piece->offset = h.data_start() + info->begin;
  piece->element_bytes = SafetensorsDtypeSize(info->dtype);
  if (info->numel() != piece->end - piece->begin) {
    return absl::DataLossError(
        absl::StrCat(h.path(), ": piece \"", piece->key, "\" does not hold its elements"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointStateReader::OpenManifest(const std::string& dir, uint32_t meta_crc) {
  const std::string path = dir + "/" + kCheckpointManifestFile;
  ASYMPO_ASSIGN_OR_RETURN(const std::string text, ReadText(path));
  if (Crc32c(text.data(), text.size()) != meta_crc) {
    return absl::DataLossError(absl::StrCat(path, " does not match meta.json's crc32c"));
  }
  const nlohmann::json m = nlohmann::json::parse(text, nullptr, false);
  try {
    if (!m.is_object() || m.at("format").get<int>() != kFormat) {
      return absl::DataLossError(absl::StrCat(path, ": not a checkpoint manifest of format 1"));
    }
    world_size_ = m.at("world_size").get<int>();
    dist_shard_ = m.at("dist_shard").get<std::string>();
    block_bytes_ = m.at("block_bytes").get<int64_t>();
    for (const auto& p : m.at("params")) {
      params_.push_back({p.at("name").get<std::string>(), p.at("shape").get<std::vector<int64_t>>(),
                         p.at("moments").get<bool>()});
    }
    for (const auto& f : m.at("files")) {
      const size_t file = files_.size();
      ASYMPO_RETURN_IF_ERROR(
          AddFile(dir + "/" + f.at("file").get<std::string>(), f.at("bytes").get<uint64_t>()));
      if (f.contains("rng")) {
        rng_key_ = f.at("rng").get<std::string>(), rng_file_ = file;
        rng_crc_ = f.at("rng_crc32c").get<uint32_t>();
      }
      for (const auto& p : f.at("pieces")) {
        Piece piece;
        ASYMPO_ASSIGN_OR_RETURN(piece.kind, KindOf(p.at("kind").get<std::string>()));
        piece.begin = p.at("begin").get<int64_t>();
        piece.end = p.at("end").get<int64_t>();
        piece.key = p.at("key").get<std::string>();
        piece.crcs = p.at("crc32c").get<std::vector<uint32_t>>();
        ASYMPO_RETURN_IF_ERROR(Locate(&piece, file));
        const uint64_t bytes = static_cast<uint64_t>(piece.end - piece.begin) * piece.element_bytes;
        if (block_bytes_ <= 0 ||
            piece.crcs.size() != (bytes + static_cast<uint64_t>(block_bytes_) - 1) /
                                     static_cast<uint64_t>(block_bytes_)) {
          return absl::DataLossError(
              absl::StrCat(path, ": piece \"", piece.key, "\" has the wrong number of block CRCs"));
        }
        const std::string param = p.at("param").get<std::string>();
        pieces_[{param, static_cast<int>(piece.kind)}].push_back(std::move(piece));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, " is malformed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status CheckpointStateReader::OpenOldLayout(const std::string& dir, uint32_t meta_crc,
                                                  const std::vector<std::string>& param_order) {
  ASYMPO_RETURN_IF_ERROR(AddFile(dir + "/" + kCheckpointStateFile, 0));
  old_crc_ = meta_crc;
  const SafetensorsFile& h = *files_[0].header;
  const std::string prefix = kCheckpointOptimizerPrefix;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const std::string& name : h.Names()) {
    if (name == kCheckpointRngTensor) {
      rng_key_ = name;
      continue;
    }
    Piece piece;
    std::string param = name;
    piece.kind = StateKind::kWeight;
    if (name.rfind(prefix, 0) == 0) {
      const std::string rest = name.substr(prefix.size());
      const bool sq = rest.rfind("exp_avg_sq.", 0) == 0;
      size_t i = 0;
      if ((!sq && rest.rfind("exp_avg.", 0) != 0) ||
          !absl::SimpleAtoi(rest.substr(rest.find('.') + 1), &i) || i >= param_order.size()) {
        return absl::DataLossError(
            absl::StrCat(h.path(), ": optimizer entry \"", name, "\" is not one of this model's"));
      }
      param = param_order[i];
      piece.kind = sq ? StateKind::kExpAvgSq : StateKind::kExpAvg;
    } else {
      shapes[name] = h.Find(name)->shape;
    }
    piece.key = name;
    piece.end = h.Find(name)->numel();
    ASYMPO_RETURN_IF_ERROR(Locate(&piece, 0));
    pieces_[{param, static_cast<int>(piece.kind)}].push_back(std::move(piece));
  }
  for (const std::string& name : param_order) {
    auto it = shapes.find(name);
    if (it == shapes.end()) continue;  // a missing weight is found by the caller's checks
    const bool moments = pieces_.count({name, static_cast<int>(StateKind::kExpAvg)}) > 0;
    params_.push_back({name, it->second, moments});
    shapes.erase(it);
  }
  for (auto& [name, shape] : shapes) params_.push_back({name, shape, false});
  return absl::OkStatus();
}

const CheckpointParam* CheckpointStateReader::Find(const std::string& name) const {
  auto it = param_index_.find(name);
  return it == param_index_.end() ? nullptr : &params_[it->second];
}

absl::StatusOr<std::vector<const CheckpointStateReader::Piece*>> CheckpointStateReader::Cover(
    StateKind kind, const std::string& name, int64_t begin, int64_t end) const {
  std::vector<const Piece*> out;
  auto it = pieces_.find({name, static_cast<int>(kind)});
  int64_t at = begin;
  if (it != pieces_.end()) {
    for (const Piece& p : it->second) {
      if (p.end <= at || p.begin >= end) continue;
      if (p.begin > at) break;
      out.push_back(&p);
      at = p.end;
      if (at >= end) break;
    }
  }
  if (at < end) {
    return absl::DataLossError(absl::StrCat(dir_, " lacks elements ", at, "..", end, " of ", name,
                                            "'s ", StateKindName(kind)));
  }
  return out;
}

absl::Status CheckpointStateReader::PRead(const File& file, uint64_t offset, size_t bytes,
                                          void* out) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t r = ::pread(file.fd, static_cast<char*>(out) + done, bytes - done,
                              static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return absl::DataLossError(absl::StrCat("cannot read ", file.path, ": ",
                                              r < 0 ? std::strerror(errno) : "short file"));
    }
    done += static_cast<size_t>(r);
  }
  bytes_read_ += static_cast<int64_t>(bytes);
  return absl::OkStatus();
}

absl::Status CheckpointStateReader::VerifyBlock(const Piece& piece, size_t block) {
  if (!verified_.insert({&piece, block}).second) return absl::OkStatus();
  const uint64_t bytes = static_cast<uint64_t>(piece.end - piece.begin) * piece.element_bytes;
  const uint64_t at = block * static_cast<uint64_t>(block_bytes_);
  std::vector<char> buffer(static_cast<size_t>(std::min<uint64_t>(block_bytes_, bytes - at)));
  ASYMPO_RETURN_IF_ERROR(
      PRead(files_[piece.file], piece.offset + at, buffer.size(), buffer.data()));
  if (Crc32c(buffer.data(), buffer.size()) != piece.crcs[block]) {
    verified_.erase({&piece, block});
    return absl::DataLossError(absl::StrCat(files_[piece.file].path, ": piece \"", piece.key,
                                            "\" block ", block, " does not match its CRC-32C"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointStateReader::VerifyOldFile() {
  if (old_checked_) return absl::OkStatus();
  ASYMPO_ASSIGN_OR_RETURN(const uint32_t crc, CheckpointFileCrc(files_[0].path));
  if (crc != old_crc_) {
    return absl::DataLossError(
        absl::StrFormat("%s has CRC-32C %08x, meta.json says %08x", files_[0].path, crc, old_crc_));
  }
  old_checked_ = true;
  return absl::OkStatus();
}

absl::Status CheckpointStateReader::Verify(StateKind kind, const std::string& name, int64_t begin,
                                           int64_t length) {
  ASYMPO_ASSIGN_OR_RETURN(const std::vector<const Piece*> cover,
                          Cover(kind, name, begin, begin + length));
  if (block_bytes_ == 0) return VerifyOldFile();
  for (const Piece* p : cover) {
    const int64_t from = std::max(begin, p->begin) - p->begin;
    const int64_t to = std::min(begin + length, p->end) - p->begin;
    const int64_t per_block = block_bytes_ / static_cast<int64_t>(p->element_bytes);
    for (int64_t b = from / per_block; b <= (to - 1) / per_block; ++b) {
      ASYMPO_RETURN_IF_ERROR(VerifyBlock(*p, static_cast<size_t>(b)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointStateReader::Read(StateKind kind, const std::string& name, int64_t begin,
                                         at::Tensor dest) {
  const int64_t length = dest.numel();
  ASYMPO_ASSIGN_OR_RETURN(const std::vector<const Piece*> cover,
                          Cover(kind, name, begin, begin + length));
  for (const Piece* p : cover) {
    const int64_t from = std::max(begin, p->begin);
    const int64_t to = std::min(begin + length, p->end);
    at::Tensor host = at::empty({to - from}, at::TensorOptions().dtype(p->dtype));
    ASYMPO_RETURN_IF_ERROR(PRead(
        files_[p->file], p->offset + static_cast<uint64_t>(from - p->begin) * p->element_bytes,
        static_cast<size_t>(host.nbytes()), host.data_ptr()));
    dest.narrow(0, from - begin, to - from).copy_(host);
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> CheckpointStateReader::Rng() {
  if (rng_key_.empty()) return at::Tensor();
  if (block_bytes_ == 0) ASYMPO_RETURN_IF_ERROR(VerifyOldFile());
  ASYMPO_ASSIGN_OR_RETURN(at::Tensor t, files_[rng_file_].header->Get(rng_key_));
  t = t.clone();
  if (block_bytes_ != 0 && Crc32c(t.data_ptr(), static_cast<size_t>(t.nbytes())) != rng_crc_) {
    return absl::DataLossError(
        absl::StrCat(files_[rng_file_].path, ": the random state does not match its CRC-32C"));
  }
  return t;
}

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ReadCheckpointWeights(
    CheckpointStateReader& reader) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const CheckpointParam& p : reader.params()) {
    ASYMPO_RETURN_IF_ERROR(reader.Verify(StateKind::kWeight, p.name, 0, p.numel()));
    at::Tensor t = at::empty({p.numel()}, at::kFloat);
    ASYMPO_RETURN_IF_ERROR(reader.Read(StateKind::kWeight, p.name, 0, t));
    out.emplace_back(p.name, t.view(p.shape));
  }
  return out;
}

}  // namespace asympo

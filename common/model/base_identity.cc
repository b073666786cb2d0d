#include "common/model/base_identity.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/model/safetensors_io.h"
#include "common/model/torch_errors.h"
#include "common/status_macros.h"

namespace asympo {
namespace {

namespace fs = std::filesystem;

struct Digest {
  uint32_t crc = 0;
  uint64_t bytes = 0;
  void Add(const void* data, size_t n) {
    crc = Crc32c(data, n, crc);
    bytes += n;
  }
};

absl::Status AddFile(const fs::path& path, Digest* d) {
  ASYMPO_ASSIGN_OR_RETURN(std::shared_ptr<FileMapping> m, FileMapping::Open(path.string()));
  d->Add(m->data(), m->size());
  return absl::OkStatus();
}

absl::Status DigestDirectory(const std::string& dir, Digest* d) {
  std::vector<fs::path> files{fs::path(dir) / "config.json"};
  std::error_code ec;
  std::vector<fs::path> weights;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (absl::EndsWith(name, ".safetensors") || absl::EndsWith(name, ".safetensors.index.json")) {
      weights.push_back(e.path());
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  std::sort(weights.begin(), weights.end());
  files.insert(files.end(), weights.begin(), weights.end());
  for (const fs::path& f : files) {
    const std::string name = f.filename().string();
    d->Add(name.data(), name.size());  // the names count too
    if (absl::Status s = AddFile(f, d); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> BaseIdentity(const std::string& model, const PolicyModel& policy) {
  Digest d;
  if (model == "tiny") {
    ASYMPO_RETURN_IF_ERROR(GuardTorch("hashing the base weights", [&]() -> absl::Status {
      for (const auto& [name, t] : policy.named_weights()) {
        const at::Tensor host = t.detach().to(at::kCPU, at::kFloat).contiguous();
        d.Add(name.data(), name.size());
        d.Add(host.data_ptr(), host.nbytes());
      }
      return absl::OkStatus();
    }));
  } else {
    ASYMPO_RETURN_IF_ERROR(DigestDirectory(model, &d));
  }
  nlohmann::json j;
  j["path"] = model;
  j["crc32c"] = absl::StrFormat("%08x", d.crc);
  j["bytes"] = d.bytes;
  return j.dump();
}

absl::Status CheckSameBase(const std::string& saved, const std::string& mine,
                           const std::string& where) {
  const nlohmann::json a = nlohmann::json::parse(saved, nullptr, false);
  const nlohmann::json b = nlohmann::json::parse(mine, nullptr, false);
  const auto describe = [](const nlohmann::json& j) {
    return absl::StrCat(j.value("path", std::string("?")), " (CRC-32C ",
                        j.value("crc32c", std::string("?")), ", ", j.value("bytes", uint64_t{0}),
                        " bytes)");
  };
  if (!a.is_object() || !a.contains("crc32c")) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, " holds adapters but does not name their base model"));
  }
  if (!b.is_object() || a.value("crc32c", "") != b.value("crc32c", "") ||
      a.value("bytes", uint64_t{0}) != b.value("bytes", uint64_t{0})) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, " holds adapters trained on the base ", describe(a), "; this learner's base is ",
        b.is_object() ? describe(b) : "unknown",
        ": adapters are meaningless on another base (start with that --model, or give another "
        "--checkpoint_dir)"));
  }
  return absl::OkStatus();
}

}  // namespace asympo

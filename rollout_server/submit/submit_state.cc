#include "rollout_server/submit/submit_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/security/x509.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "nlohmann/json.hpp"

namespace asympo::submit {
namespace {

constexpr size_t kDigestHex = 32;  // 128 bits
constexpr char kHeaderKey[] = "asympo_submit_state";
constexpr int kFormat = 2;

constexpr size_t kNonceHex = 12;  // 48 random bits

// kNonceHex random hex digits, from the system's entropy source.
std::string NewNonce() {
  std::random_device random;
  std::string out;
  while (out.size() < kNonceHex) absl::StrAppend(&out, absl::Hex(random(), absl::kZeroPad8));
  return out.substr(0, kNonceHex);
}

bool IsNonce(const nlohmann::json& j) {
  if (!j.is_string() || j.get<std::string>().size() != kNonceHex) return false;
  for (char c : j.get<std::string>()) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string GroupDigest(const v1::PromptGroup& g) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    g.SerializeToCodedStream(&out);
  }
  return security::Sha256Hex(bytes).substr(0, kDigestHex);
}

std::vector<std::string> RowKeys(const std::vector<const v1::PromptGroup*>& groups) {
  absl::flat_hash_map<std::string, int> seen;
  std::vector<std::string> keys;
  keys.reserve(groups.size());
  for (const v1::PromptGroup* g : groups) {
    std::string key = GroupDigest(*g);
    const int n = seen[key]++;
    if (n > 0) absl::StrAppend(&key, ".", n);
    keys.push_back(std::move(key));
  }
  return keys;
}

std::string WindowId(const std::string& prefix, const std::vector<std::string>& keys) {
  std::string all;
  for (const std::string& k : keys) absl::StrAppend(&all, k, "\n");
  return prefix + security::Sha256Hex(all).substr(0, kDigestHex);
}

StateFile::~StateFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status StateFile::Open(const std::string& path) {
  if (path == "none") return absl::OkStatus();
  path_ = path;
  std::string text;
  if (std::ifstream in(path, std::ios::binary); in) {
    std::ostringstream all;
    all << in.rdbuf();
    text = all.str();
  }
  // A line cut by a crash while it was written was never acted on: drop it.
  if (!text.empty() && text.back() != '\n') {
    const size_t nl = text.rfind('\n');
    text.resize(nl == std::string::npos ? 0 : nl + 1);
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0 || ::ftruncate(fd_, static_cast<off_t>(text.size())) != 0 ||
      ::lseek(fd_, 0, SEEK_END) < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write --state ", path));
  }
  std::istringstream lines(text);
  int n = 0;
  for (std::string line; std::getline(lines, line);) {
    ++n;
    if (n == 1) {
      const nlohmann::json h = nlohmann::json::parse(line, nullptr, false);
      if (!h.is_object() || h.value(kHeaderKey, 0) != kFormat) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--state ", path, " was not written by this asympo-submit (its first line is not ",
            Dump({{kHeaderKey, kFormat}}),
            "); an earlier one keyed windows by line numbers, which cannot be matched to rows "
            "by content: finish that file with the asympo-submit that wrote it, or give a new "
            "--state (every row is then sent again)"));
      }
      continue;
    }
    if (absl::Status s = Apply(line); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": ", s.message()));
    }
  }
  if (n == 0) Append(Dump({{kHeaderKey, kFormat}}));
  if (run_nonce_.empty()) Record({{"run_nonce", NewNonce()}});
  return absl::OkStatus();
}

bool StateFile::Trained(const std::string& key) const {
  auto it = claimed_.find(key);
  return it != claimed_.end() && windows_[it->second].state == WindowState::kTrained;
}

absl::Status StateFile::Apply(const std::string& line) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object() || j.size() < 1) return absl::InvalidArgumentError("not a JSON object");
  if (j.contains("run_nonce")) {
    if (!IsNonce(j["run_nonce"])) {
      return absl::InvalidArgumentError(
          absl::StrCat("run_nonce is not ", kNonceHex, " hex digits"));
    }
    run_nonce_ = j["run_nonce"].get<std::string>();
    return absl::OkStatus();
  }
  if (j.contains("window")) {
    if (!j["window"].is_string() || !j.contains("rows") || !j["rows"].is_array()) {
      return absl::InvalidArgumentError("a window without an id or rows");
    }
    std::vector<std::string> keys;
    for (const auto& k : j["rows"]) {
      if (!k.is_string()) return absl::InvalidArgumentError("a row key that is not a string");
      keys.push_back(k.get<std::string>());
    }
    const std::string id = j["window"].get<std::string>();
    auto [it, added] = by_id_.try_emplace(id, windows_.size());
    if (added) windows_.push_back({});
    Window& w = windows_[it->second];
    w = Window{id, std::move(keys), WindowState::kFormed, "", 0};
    for (const std::string& k : w.keys) claimed_[k] = it->second;
    return absl::OkStatus();
  }
  for (const char* what : {"accepted", "trained", "refused"}) {
    if (!j.contains(what)) continue;
    auto it = j[what].is_string() ? by_id_.find(j[what].get<std::string>()) : by_id_.end();
    if (it == by_id_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", what, "\" names no window before it"));
    }
    Window& w = windows_[it->second];
    if (what == std::string("accepted")) {
      if (!j.value("incarnation", nlohmann::json()).is_string() ||
          !j.value("version", nlohmann::json()).is_number_unsigned()) {
        return absl::InvalidArgumentError("\"accepted\" without incarnation and version");
      }
      w.state = WindowState::kAccepted;
      w.incarnation = j["incarnation"].get<std::string>();
      w.version = j["version"].get<uint64_t>();
    } else if (what == std::string("trained")) {
      w.state = WindowState::kTrained;
    } else {
      w.state = WindowState::kRefused;
      for (const std::string& k : w.keys) {
        if (auto c = claimed_.find(k); c != claimed_.end() && c->second == it->second) {
          claimed_.erase(c);
        }
      }
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError("neither window, accepted, trained nor refused");
}

void StateFile::Append(const std::string& line) {
  if (fd_ < 0) return;
  const std::string text = line + "\n";
  if (::write(fd_, text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
      ::fsync(fd_) != 0) {
    std::cerr << "asympo-submit: warning: cannot record " << line << " in --state " << path_
              << "\n";
  }
}

void StateFile::Record(const nlohmann::json& j) {
  const std::string line = Dump(j);
  const absl::Status applied = Apply(line);  // our own lines always apply
  if (!applied.ok()) std::cerr << "asympo-submit: internal error: " << applied.message() << "\n";
  Append(line);
}

size_t StateFile::Formed(const std::string& id, const std::vector<std::string>& keys) {
  Record({{"window", id}, {"rows", keys}});
  return by_id_.at(id);
}

void StateFile::Accepted(size_t window, const std::string& incarnation, uint64_t version) {
  Record({{"accepted", windows_[window].id}, {"incarnation", incarnation}, {"version", version}});
}

void StateFile::Trained(size_t window) { Record({{"trained", windows_[window].id}}); }

void StateFile::Refused(size_t window) { Record({{"refused", windows_[window].id}}); }

}  // namespace asympo::submit

// ProcessGroupGloo.hpp declares its class only with USE_C10D_GLOO, which the
// Debian LibTorch was built with (its libtorch_cpu carries the symbols).
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include "learner_server/data_parallel.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <numeric>

#include <ATen/ATen.h>
#include <glog/logging.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "common/status_macros.h"

namespace asympo::learner {
namespace {

constexpr char kRankFailureUrl[] = "type.asympo/learner.rank_failure";

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

// One integer setting: the flag when given, else the first set variable.
absl::StatusOr<std::optional<int>> IntSetting(
    std::optional<int> flag, std::initializer_list<const char*> variables,
    const std::function<const char*(const char*)>& getenv) {
  if (flag.has_value()) return flag;
  for (const char* name : variables) {
    const char* value = getenv(name);
    if (value == nullptr || *value == '\0') continue;
    int x = 0;
    if (!absl::SimpleAtoi(value, &x)) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", name, "=\"", value, "\" is not an integer"));
    }
    return std::optional<int>(x);
  }
  return std::optional<int>();
}

// The status of a failed collective (or rendezvous).
absl::Status RankFailure(absl::string_view what, const std::exception& e,
                         absl::Duration timeout) {
  std::string message(e.what());
  if (const size_t nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
  absl::Status s = absl::UnavailableError(absl::StrCat(
      "data parallel: ", what, " failed: ", message,
      " (a rank died, hung, or did not answer within ", absl::FormatDuration(timeout), ")"));
  s.SetPayload(kRankFailureUrl, absl::Cord("1"));
  return s;
}

// Runs a collective and waits for it; any exception becomes a RankFailure.
template <typename F>
absl::Status Collective(absl::string_view what, absl::Duration timeout, F&& start) {
  try {
    c10::intrusive_ptr<c10d::Work> work = start();
    work->wait();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return RankFailure(what, e, timeout);
  }
}

// Header: kind, padded shard bytes, the totals (4), then each rank's bytes.
constexpr int64_t kHeaderFixed = 6;

void AppendU64(std::string* out, uint64_t x) { out->append(reinterpret_cast<char*>(&x), 8); }

std::string SerializeShard(const std::vector<QueuedGroup>& groups,
                           const std::vector<size_t>& indices) {
  std::string out;
  for (size_t i : indices) {
    std::string bytes = groups[i].group.SerializeAsString();
    AppendU64(&out, groups[i].arrival_version);
    AppendU64(&out, static_cast<uint64_t>(groups[i].tokens));
    AppendU64(&out, bytes.size());
    out += bytes;
  }
  return out;
}

absl::StatusOr<std::vector<QueuedGroup>> ParseShard(const uint8_t* data, size_t size) {
  std::vector<QueuedGroup> out;
  size_t at = 0;
  auto u64 = [&](uint64_t* x) {
    if (size - at < 8) return false;
    std::memcpy(x, data + at, 8);
    at += 8;
    return true;
  };
  while (at < size) {
    QueuedGroup q;
    uint64_t tokens = 0, bytes = 0;
    if (!u64(&q.arrival_version) || !u64(&tokens) || !u64(&bytes) || size - at < bytes ||
        !q.group.ParseFromArray(data + at, static_cast<int>(bytes))) {
      return absl::DataLossError("data parallel: a step shard from rank 0 does not parse");
    }
    at += bytes;
    q.tokens = static_cast<int64_t>(tokens);
    out.push_back(std::move(q));
  }
  return out;
}

}  // namespace

absl::StatusOr<DataParallelOptions> ResolveDataParallel(
    const DataParallelFlags& f, const std::function<const char*(const char*)>& getenv) {
  DataParallelOptions o;
  ASYMPO_ASSIGN_OR_RETURN(std::optional<int> world,
                          IntSetting(f.world_size, {"WORLD_SIZE", "SLURM_NTASKS"}, getenv));
  ASYMPO_ASSIGN_OR_RETURN(std::optional<int> rank,
                          IntSetting(f.rank, {"RANK", "SLURM_PROCID"}, getenv));
  ASYMPO_ASSIGN_OR_RETURN(std::optional<int> port,
                          IntSetting(f.master_port, {"MASTER_PORT"}, getenv));
  o.world_size = world.value_or(1);
  o.rank = rank.value_or(0);
  if (o.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the world size is ", o.world_size, "; it must be at least 1"));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("the rank is ", o.rank, "; with a world of ",
                                                   o.world_size, " it must be in [0, ",
                                                   o.world_size - 1, "]"));
  }
  o.master_port = port.value_or(29500);
  if (o.master_port < 1 || o.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("the master port is ", o.master_port, "; expected 1..65535"));
  }
  o.master_addr = f.master_addr;
  if (const char* env = getenv("MASTER_ADDR"); o.master_addr.empty() && env != nullptr) {
    o.master_addr = env;
  }
  if (o.master_addr.empty()) {
    if (o.world_size > 1) {
      return absl::InvalidArgumentError(
          "a world of more than one rank needs rank 0's address: --dist_master_addr or "
          "MASTER_ADDR");
    }
    o.master_addr = "127.0.0.1";
  }
  o.local_addr = f.local_addr;
  o.timeout = f.timeout;
  if (o.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the data-parallel timeout must be positive");
  }
  o.insecure = f.insecure;
  if (o.world_size > 1 && !o.insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a world of ", o.world_size,
        " ranks talks over c10d's TCPStore (listening on port ", o.master_port,
        " of every interface of rank 0) and Gloo, neither authenticated nor encrypted; "
        "on a trusted network pass --dist_insecure to accept that"));
  }
  return o;
}

std::vector<std::vector<size_t>> SplitByTokens(const std::vector<QueuedGroup>& groups, int world) {
  std::vector<size_t> order(groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return groups[a].tokens > groups[b].tokens; });
  std::vector<std::vector<size_t>> out(static_cast<size_t>(world));
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  for (size_t i : order) {
    const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += groups[i].tokens;
    out[r].push_back(i);
  }
  for (auto& indices : out) std::sort(indices.begin(), indices.end());
  return out;
}

bool IsRankFailure(const absl::Status& status) {
  return status.GetPayload(kRankFailureUrl).has_value();
}

DataParallel::DataParallel(const DataParallelOptions& options) : options_(options) {}
DataParallel::~DataParallel() = default;

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Create(const DataParallelOptions& o) {
  std::unique_ptr<DataParallel> dp(new DataParallel(o));
  const auto timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(o.timeout));
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(o.master_port);
    so.isServer = o.rank == 0;
    so.numWorkers = static_cast<size_t>(o.world_size);
    so.timeout = timeout;
    dp->store_ = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    auto go = c10d::ProcessGroupGloo::Options::create(timeout);
    std::string local = o.local_addr;
    if (local.empty() && IsLoopback(o.master_addr)) local = "127.0.0.1";
    if (local.empty()) {
      char host[256] = {};
      gethostname(host, sizeof(host) - 1);
      local = host;
    }
    go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(local));
    go->threads = 2;
    dp->group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(dp->store_, o.rank, o.world_size, go);
  } catch (const std::exception& e) {
    return RankFailure(absl::StrCat("joining the world of ", o.world_size, " at ", o.master_addr,
                                    ":", o.master_port, " as rank ", o.rank),
                       e, o.timeout);
  }
  LOG(INFO) << "data parallel: rank " << o.rank << " of " << o.world_size << " (Gloo, master "
            << o.master_addr << ":" << o.master_port << ", timeout "
            << absl::FormatDuration(o.timeout) << ")";
  return dp;
}

absl::Status DataParallel::SendHeader(StepMessage::Kind kind, const StepTotals& totals,
                                      const std::vector<int64_t>& bytes) {
  at::Tensor header = at::zeros({kHeaderFixed + world_size()}, at::kLong);
  int64_t* h = header.data_ptr<int64_t>();
  h[0] = static_cast<int64_t>(kind);
  h[1] = bytes.empty() ? 0 : *std::max_element(bytes.begin(), bytes.end());
  h[2] = totals.groups, h[3] = totals.responses, h[4] = totals.tokens;
  h[5] = totals.degenerate_responses;
  for (size_t r = 0; r < bytes.size(); ++r) h[kHeaderFixed + static_cast<int64_t>(r)] = bytes[r];
  std::vector<at::Tensor> t{header};
  return Collective("sending the step header", options_.timeout,
                    [&] { return group_->broadcast(t); });
}

absl::Status DataParallel::SendIdle() { return SendHeader(StepMessage::Kind::kIdle, {}, {}); }
absl::Status DataParallel::SendStop() { return SendHeader(StepMessage::Kind::kStop, {}, {}); }

absl::StatusOr<StepMessage> DataParallel::SendStep(const std::vector<QueuedGroup>& groups) {
  StepMessage own;
  own.kind = StepMessage::Kind::kStep;
  own.totals = StepTotalsOf(groups);
  const std::vector<std::vector<size_t>> split = SplitByTokens(groups, world_size());
  std::vector<std::string> shards;
  std::vector<int64_t> bytes;
  for (const auto& indices : split) {
    shards.push_back(SerializeShard(groups, indices));
    bytes.push_back(static_cast<int64_t>(shards.back().size()));
  }
  ASYMPO_RETURN_IF_ERROR(SendHeader(StepMessage::Kind::kStep, own.totals, bytes));
  const int64_t padded = std::max<int64_t>(1, *std::max_element(bytes.begin(), bytes.end()));
  std::vector<at::Tensor> inputs;
  for (const std::string& shard : shards) {
    at::Tensor t = at::zeros({padded}, at::kByte);
    std::memcpy(t.data_ptr<uint8_t>(), shard.data(), shard.size());
    inputs.push_back(t);
  }
  std::vector<at::Tensor> output{at::empty({padded}, at::kByte)};
  std::vector<std::vector<at::Tensor>> input_lists{inputs};
  ASYMPO_RETURN_IF_ERROR(Collective("scattering the step's groups", options_.timeout,
                                    [&] { return group_->scatter(output, input_lists); }));
  for (size_t i : split[0]) own.shard.push_back(groups[i]);
  return own;
}

absl::StatusOr<StepMessage> DataParallel::Receive() {
  at::Tensor header = at::zeros({kHeaderFixed + world_size()}, at::kLong);
  std::vector<at::Tensor> t{header};
  ASYMPO_RETURN_IF_ERROR(Collective("waiting for rank 0's next step", options_.timeout,
                                    [&] { return group_->broadcast(t); }));
  const int64_t* h = header.data_ptr<int64_t>();
  StepMessage m;
  if (h[0] < 0 || h[0] > 2) {
    return absl::DataLossError(absl::StrCat("data parallel: unknown message kind ", h[0]));
  }
  m.kind = static_cast<StepMessage::Kind>(h[0]);
  if (m.kind != StepMessage::Kind::kStep) return m;
  m.totals.groups = h[2], m.totals.responses = h[3], m.totals.tokens = h[4];
  m.totals.degenerate_responses = h[5];
  const int64_t padded = std::max<int64_t>(1, h[1]);
  const int64_t mine = h[kHeaderFixed + rank()];
  std::vector<at::Tensor> output{at::empty({padded}, at::kByte)};
  std::vector<std::vector<at::Tensor>> none;
  ASYMPO_RETURN_IF_ERROR(Collective("receiving the step's groups", options_.timeout,
                                    [&] { return group_->scatter(output, none); }));
  ASYMPO_ASSIGN_OR_RETURN(m.shard,
                          ParseShard(output[0].data_ptr<uint8_t>(), static_cast<size_t>(mine)));
  return m;
}

absl::Status DataParallel::BroadcastState(PolicyModel* model, AdamW* optimizer,
                                          uint64_t* version) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> params = model->parameters();
  const int64_t n = static_cast<int64_t>(params.size());
  // [version, AdamW steps, then per parameter: has exp_avg, has exp_avg_sq]
  at::Tensor header = at::zeros({2 + 2 * n}, at::kLong);
  std::vector<std::pair<std::string, at::Tensor>> state;
  if (rank() == 0) {
    state = optimizer->StateTensors();
    int64_t* h = header.data_ptr<int64_t>();
    h[0] = static_cast<int64_t>(*version);
    h[1] = optimizer->step_count();
    for (const auto& [name, t] : state) {
      const bool avg = absl::StartsWith(name, "exp_avg.");
      int64_t i = 0;
      absl::SimpleAtoi(name.substr(name.find('.') + 1), &i);
      h[2 + 2 * i + (avg ? 0 : 1)] = 1;
    }
  }
  std::vector<at::Tensor> ht{header};
  ASYMPO_RETURN_IF_ERROR(Collective("sending rank 0's state", options_.timeout,
                                    [&] { return group_->broadcast(ht); }));
  const int64_t* h = header.data_ptr<int64_t>();
  std::vector<at::Tensor> tensors;
  std::vector<std::pair<std::string, at::Tensor>> received;
  for (int64_t i = 0; i < n; ++i) tensors.push_back(params[static_cast<size_t>(i)]);
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 2; ++k) {
      if (h[2 + 2 * i + k] == 0) continue;
      const std::string name = absl::StrCat(k == 0 ? "exp_avg." : "exp_avg_sq.", i);
      at::Tensor t;
      if (rank() == 0) {
        for (const auto& [sn, st] : state) {
          if (sn == name) t = st;
        }
      } else {
        t = at::zeros_like(params[static_cast<size_t>(i)]);
      }
      received.emplace_back(name, t);
      tensors.push_back(t);
    }
  }
  for (at::Tensor& t : tensors) {
    std::vector<at::Tensor> one{t};
    ASYMPO_RETURN_IF_ERROR(Collective("sending rank 0's state", options_.timeout,
                                      [&] { return group_->broadcast(one); }));
  }
  if (rank() != 0) {
    ASYMPO_RETURN_IF_ERROR(optimizer->LoadState(received, h[1]));
    *version = static_cast<uint64_t>(h[0]);
  }
  return absl::OkStatus();
}

absl::Status DataParallel::SumValues(std::vector<double>* values) {
  at::Tensor t = at::from_blob(values->data(), {static_cast<int64_t>(values->size())},
                               at::kDouble).clone();
  std::vector<at::Tensor> one{t};
  ASYMPO_RETURN_IF_ERROR(Collective("summing the step's diagnostics", options_.timeout,
                                    [&] { return group_->allreduce(one); }));
  std::memcpy(values->data(), t.data_ptr<double>(), values->size() * sizeof(double));
  return absl::OkStatus();
}

absl::Status DataParallel::SumGradients(const std::vector<at::Tensor>& gradients) {
  // Buckets of up to 64 MiB of float32, one all-reduce each, as DDP does.
  constexpr int64_t kBucketElements = int64_t{16} << 20;
  at::NoGradGuard no_grad;
  size_t begin = 0;
  while (begin < gradients.size()) {
    size_t end = begin;
    int64_t elements = 0;
    while (end < gradients.size() &&
           (end == begin || elements + gradients[end].numel() <= kBucketElements)) {
      elements += gradients[end++].numel();
    }
    std::vector<at::Tensor> flat;
    for (size_t i = begin; i < end; ++i) flat.push_back(gradients[i].reshape({-1}));
    std::vector<at::Tensor> bucket{at::cat(flat)};
    ASYMPO_RETURN_IF_ERROR(Collective("summing the gradients", options_.timeout,
                                      [&] { return group_->allreduce(bucket); }));
    int64_t at = 0;
    for (size_t i = begin; i < end; ++i) {
      const int64_t k = gradients[i].numel();
      gradients[i].copy_(bucket[0].narrow(0, at, k).view(gradients[i].sizes()));
      at += k;
    }
    begin = end;
  }
  return absl::OkStatus();
}

}  // namespace asympo::learner

// The data-parallel learner's collectives on a c10d process group of either
// backend (collective_group.h): Gloo's take host tensors for reduce, gather
// and scatter (the others also device tensors); NCCL's take only tensors on
// the rank's GPU. Every collective's tensors are staged where the backend
// takes them and copied back after.
#include "learner_server/parallel/data_parallel.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>

#include <ATen/ATen.h>
#include <glog/logging.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/collective/collective_group.h"
#include "common/status_macros.h"
#include "learner_server/trainer/trainer.h"

namespace asympo::learner {
namespace {

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

// Runs a collective and waits for it; any exception becomes a RankFailure.
template <typename F>
absl::Status Collective(absl::string_view what, absl::Duration timeout, F&& start) {
  try {
    c10::intrusive_ptr<c10d::Work> work = start();
    work->wait();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return RankFailure(what, e.what(), timeout);
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

struct DataParallel::Group {
  c10::intrusive_ptr<collective::CollectiveGroup> pg;
  // NCCL: every collective's tensors on `device`, the rank's GPU. Gloo:
  // reduce, gather and scatter on the host, the others where they are.
  bool nccl = false;
  at::Device device{at::kCPU};

  // Where the backend takes `t` (host_only: a Gloo collective that takes
  // host tensors only): `t` itself when it is there already, else a copy.
  at::Tensor Staged(const at::Tensor& t, bool host_only) const {
    if (nccl) return t.device() == device ? t : t.to(device);
    return host_only && !t.is_cpu() ? t.cpu() : t;
  }
  std::vector<at::Tensor> Staged(const std::vector<at::Tensor>& ts, bool host_only) const {
    std::vector<at::Tensor> out;
    out.reserve(ts.size());
    for (const at::Tensor& t : ts) out.push_back(Staged(t, host_only));
    return out;
  }
};

namespace {

// Copies a staged result back into the tensor it stands for.
void CopyBack(const at::Tensor& staged, at::Tensor& tensor) {
  if (!staged.is_same(tensor)) tensor.copy_(staged);
}
void CopyBack(const std::vector<at::Tensor>& staged, std::vector<at::Tensor>& tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) CopyBack(staged[i], tensors[i]);
}

// A tensor on the host (a staged header or values read back).
at::Tensor Host(const at::Tensor& t) { return t.is_cpu() ? t : t.cpu(); }

}  // namespace

DataParallel::DataParallel(const DataParallelOptions& options) : options_(options) {}
DataParallel::~DataParallel() = default;

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Create(const DataParallelOptions& o) {
  std::unique_ptr<DataParallel> dp(new DataParallel(o));
  const auto timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(o.timeout));
  const bool nccl = o.backend == DistBackend::kNccl;
  if (nccl && !o.device.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data parallel: NCCL needs the rank's tensors on a GPU, and the device is ",
                     o.device.str()));
  }
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(o.master_port);
    so.isServer = o.rank == 0;
    so.numWorkers = static_cast<size_t>(o.world_size);
    so.timeout = timeout;
    dp->store_ = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    dp->group_ = std::make_unique<Group>();
    dp->group_->nccl = nccl;
    if (nccl) {
      dp->group_->device = o.device;
      dp->group_->pg = collective::NewNcclGroup(dp->store_, o.rank, o.world_size, timeout);
    } else {
      std::string local = o.local_addr;
      if (local.empty() && IsLoopback(o.master_addr)) local = "127.0.0.1";
      if (local.empty()) {
        char host[256] = {};
        gethostname(host, sizeof(host) - 1);
        local = host;
      }
      dp->group_->pg = collective::NewGlooGroup(dp->store_, o.rank, o.world_size, timeout, local);
    }
  } catch (const std::exception& e) {
    return RankFailure(
        absl::StrCat("joining the world of ", o.world_size, " at ", o.master_addr, ":",
                     o.master_port, " as rank ", o.rank, " (", DistBackendName(o.backend), ")"),
        e.what(), o.timeout);
  }
  LOG(INFO) << "data parallel: rank " << o.rank << " of " << o.world_size << " ("
            << (nccl ? "NCCL on " + o.device.str() : std::string("Gloo")) << ", master "
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
  std::vector<at::Tensor> t{group_->Staged(header, false)};
  return Collective("sending the step header", options_.timeout,
                    [&] { return group_->pg->broadcast(t); });
}

absl::Status DataParallel::SendIdle() { return SendHeader(StepMessage::Kind::kIdle, {}, {}); }
absl::Status DataParallel::SendStop() { return SendHeader(StepMessage::Kind::kStop, {}, {}); }
absl::Status DataParallel::SendSave(int64_t what) {
  StepTotals flags;
  flags.groups = what;  // the header's third word
  return SendHeader(StepMessage::Kind::kSave, flags, {});
}

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
  std::vector<at::Tensor> output{group_->Staged(at::empty({padded}, at::kByte), true)};
  std::vector<std::vector<at::Tensor>> input_lists{group_->Staged(inputs, true)};
  ASYMPO_RETURN_IF_ERROR(Collective("scattering the step's groups", options_.timeout,
                                    [&] { return group_->pg->scatter(output, input_lists); }));
  for (size_t i : split[0]) own.shard.push_back(groups[i]);
  return own;
}

absl::StatusOr<StepMessage> DataParallel::Receive() {
  std::vector<at::Tensor> t{
      group_->Staged(at::zeros({kHeaderFixed + world_size()}, at::kLong), false)};
  ASYMPO_RETURN_IF_ERROR(Collective("waiting for rank 0's next step", options_.timeout,
                                    [&] { return group_->pg->broadcast(t); }));
  const at::Tensor header = Host(t[0]);
  const int64_t* h = header.data_ptr<int64_t>();
  StepMessage m;
  if (h[0] < 0 || h[0] > 3) {
    return absl::DataLossError(absl::StrCat("data parallel: unknown message kind ", h[0]));
  }
  m.kind = static_cast<StepMessage::Kind>(h[0]);
  if (m.kind == StepMessage::Kind::kSave) m.save = h[2];
  if (m.kind != StepMessage::Kind::kStep) return m;
  m.totals.groups = h[2], m.totals.responses = h[3], m.totals.tokens = h[4];
  m.totals.degenerate_responses = h[5];
  const int64_t padded = std::max<int64_t>(1, h[1]);
  const int64_t mine = h[kHeaderFixed + rank()];
  std::vector<at::Tensor> output{group_->Staged(at::empty({padded}, at::kByte), true)};
  std::vector<std::vector<at::Tensor>> none;
  ASYMPO_RETURN_IF_ERROR(Collective("receiving the step's groups", options_.timeout,
                                    [&] { return group_->pg->scatter(output, none); }));
  const at::Tensor bytes = Host(output[0]);
  ASYMPO_ASSIGN_OR_RETURN(m.shard,
                          ParseShard(bytes.data_ptr<uint8_t>(), static_cast<size_t>(mine)));
  return m;
}

absl::Status DataParallel::BroadcastValues(std::vector<int64_t>* values) {
  at::Tensor t = at::zeros({static_cast<int64_t>(values->size())}, at::kLong);
  std::copy(values->begin(), values->end(), t.data_ptr<int64_t>());
  std::vector<at::Tensor> ts{group_->Staged(t, false)};
  ASYMPO_RETURN_IF_ERROR(Collective("sending rank 0's settings", options_.timeout,
                                    [&] { return group_->pg->broadcast(ts); }));
  const at::Tensor got = Host(ts[0]);
  std::copy(got.data_ptr<int64_t>(), got.data_ptr<int64_t>() + got.numel(), values->begin());
  return absl::OkStatus();
}

absl::Status DataParallel::BroadcastState(PolicyModel* model, AdamW* optimizer, uint64_t* version,
                                          bool moments) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> params = model->parameters();
  const int64_t n = static_cast<int64_t>(params.size());
  // [version, AdamW steps, then per parameter: has exp_avg, has exp_avg_sq]
  std::vector<int64_t> h(static_cast<size_t>(2 + 2 * n), 0);
  const std::vector<at::Tensor>* state[] = {&optimizer->exp_avg(), &optimizer->exp_avg_sq()};
  if (rank() == 0) {
    h[0] = static_cast<int64_t>(*version);
    h[1] = optimizer->step_count();
    for (int64_t i = 0; moments && i < n; ++i) {
      for (int k = 0; k < 2; ++k) h[2 + 2 * i + k] = (*state[k])[static_cast<size_t>(i)].defined();
    }
  }
  ASYMPO_RETURN_IF_ERROR(BroadcastValues(&h));
  std::vector<at::Tensor> tensors;
  std::vector<std::pair<std::string, at::Tensor>> received;
  for (int64_t i = 0; i < n; ++i) tensors.push_back(params[static_cast<size_t>(i)]);
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 2; ++k) {
      if (h[2 + 2 * i + k] == 0) continue;
      const size_t p = static_cast<size_t>(i);
      at::Tensor t = rank() == 0 ? (*state[k])[p] : at::zeros_like(params[p]);
      received.emplace_back(absl::StrCat(k == 0 ? "exp_avg." : "exp_avg_sq.", i), t);
      tensors.push_back(t);
    }
  }
  for (at::Tensor& t : tensors) {
    std::vector<at::Tensor> one{group_->Staged(t, false)};
    ASYMPO_RETURN_IF_ERROR(Collective("sending rank 0's state", options_.timeout,
                                      [&] { return group_->pg->broadcast(one); }));
    CopyBack(one[0], t);
  }
  if (rank() != 0) {
    if (moments) ASYMPO_RETURN_IF_ERROR(optimizer->LoadState(received, h[1]));
    *version = static_cast<uint64_t>(h[0]);
  }
  return absl::OkStatus();
}

namespace {

// Adds the seconds from construction to destruction to a counter.
class Timed {
 public:
  explicit Timed(double* seconds) : seconds_(seconds), start_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    *seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double* seconds_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

absl::Status DataParallel::SumValues(std::vector<double>* values) {
  Timed timed(&collective_seconds_);
  at::Tensor t =
      at::from_blob(values->data(), {static_cast<int64_t>(values->size())}, at::kDouble).clone();
  std::vector<at::Tensor> one{group_->Staged(t, false)};
  ASYMPO_RETURN_IF_ERROR(Collective("summing the step's diagnostics", options_.timeout,
                                    [&] { return group_->pg->allreduce(one); }));
  t = Host(one[0]);
  std::memcpy(values->data(), t.data_ptr<double>(), values->size() * sizeof(double));
  return absl::OkStatus();
}

absl::Status DataParallel::SumGradients(const std::vector<at::Tensor>& gradients) {
  Timed timed(&collective_seconds_);
  // Buckets of up to 64 MiB of float32, one all-reduce each, as DDP does
  // (the memory plan counts one).
  constexpr int64_t kBucketElements = ShardedAdamW::kBucketElements;
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
    std::vector<at::Tensor> bucket{group_->Staged(at::cat(flat), false)};
    ASYMPO_RETURN_IF_ERROR(Collective("summing the gradients", options_.timeout,
                                      [&] { return group_->pg->allreduce(bucket); }));
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

absl::Status DataParallel::ReduceScatter(std::vector<at::Tensor>& inputs, at::Tensor& output) {
  Timed timed(&collective_seconds_);
  if (group_->nccl) {
    std::vector<at::Tensor> out{group_->Staged(output, true)};
    std::vector<std::vector<at::Tensor>> in{group_->Staged(inputs, true)};
    ASYMPO_RETURN_IF_ERROR(Collective("reduce-scattering the gradients", options_.timeout,
                                      [&] { return group_->pg->reduce_scatter(out, in); }));
    CopyBack(out[0], output);
    return absl::OkStatus();
  }
  // Gloo (LibTorch 1.13) has no reduce-scatter: one reduce per rank, each
  // to the rank that owns that part.
  std::vector<at::Tensor> host = group_->Staged(inputs, true);
  for (int r = 0; r < world_size(); ++r) {
    std::vector<at::Tensor> one{host[static_cast<size_t>(r)]};
    c10d::ReduceOptions o;
    o.rootRank = r;
    ASYMPO_RETURN_IF_ERROR(Collective("reduce-scattering the gradients", options_.timeout,
                                      [&] { return group_->pg->reduce(one, o); }));
  }
  output.copy_(host[static_cast<size_t>(rank())]);
  return absl::OkStatus();
}

absl::Status DataParallel::AllGather(at::Tensor& input, std::vector<at::Tensor>& outputs) {
  Timed timed(&collective_seconds_);
  if (!group_->nccl && world_size() > 1) {
    // One broadcast from each rank, in place into its piece: Gloo's
    // all-gather receives into a flat buffer of its own first, a second
    // copy of the gathered unit on every rank while a layer runs.
    std::vector<at::Tensor> staged = group_->Staged(outputs, true);
    staged[static_cast<size_t>(rank())].copy_(input);
    for (int r = 0; r < world_size(); ++r) {
      std::vector<at::Tensor> one{staged[static_cast<size_t>(r)]};
      c10d::BroadcastOptions o;
      o.rootRank = r;
      ASYMPO_RETURN_IF_ERROR(Collective("all-gathering the weights", options_.timeout,
                                        [&] { return group_->pg->broadcast(one, o); }));
    }
    CopyBack(staged, outputs);
    return absl::OkStatus();
  }
  std::vector<at::Tensor> in{group_->Staged(input.contiguous(), true)};
  std::vector<std::vector<at::Tensor>> out{group_->Staged(outputs, true)};
  ASYMPO_RETURN_IF_ERROR(Collective("all-gathering the weights", options_.timeout,
                                    [&] { return group_->pg->allgather(out, in); }));
  CopyBack(out[0], outputs);
  return absl::OkStatus();
}

absl::Status DataParallel::GatherToRank0(at::Tensor& input, std::vector<at::Tensor>& outputs) {
  if (!group_->nccl && world_size() > 1) return GlooGatherToRank0(input, outputs);
  std::vector<at::Tensor> in{group_->Staged(input.contiguous(), true)};
  std::vector<std::vector<at::Tensor>> out;
  if (rank() == 0) out.push_back(group_->Staged(outputs, true));
  ASYMPO_RETURN_IF_ERROR(Collective("gathering the optimizer state", options_.timeout,
                                    [&] { return group_->pg->gather(out, in); }));
  if (rank() == 0) CopyBack(out[0], outputs);
  return absl::OkStatus();
}

// Point to point, each rank's input straight into rank 0's output for it:
// Gloo's gather would first receive every rank's input into one flat buffer
// of its own and copy out of it, holding the gathered size twice on rank 0
// (a second unit when a fully sharded rank 0 publishes).
absl::Status DataParallel::GlooGatherToRank0(at::Tensor& input, std::vector<at::Tensor>& outputs) {
  constexpr int kTag = 0x6761;  // no other point-to-point message is in flight
  std::vector<at::Tensor> in{group_->Staged(input.contiguous(), true)};
  if (rank() != 0) {
    return Collective("gathering the optimizer state", options_.timeout,
                      [&] { return group_->pg->send(in, 0, kTag); });
  }
  std::vector<at::Tensor> staged = group_->Staged(outputs, true);
  staged[0].copy_(in[0]);
  std::vector<std::vector<at::Tensor>> from(staged.size());
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  try {
    for (size_t r = 1; r < staged.size(); ++r) {
      from[r] = {staged[r]};
      works.push_back(group_->pg->recv(from[r], static_cast<int>(r), kTag));
    }
  } catch (const std::exception& e) {
    return RankFailure("gathering the optimizer state", e.what(), options_.timeout);
  }
  for (auto& work : works) {
    ASYMPO_RETURN_IF_ERROR(
        Collective("gathering the optimizer state", options_.timeout, [&] { return work; }));
  }
  CopyBack(staged, outputs);
  return absl::OkStatus();
}

absl::Status DataParallel::ScatterFromRank0(std::vector<at::Tensor>& inputs, at::Tensor& output) {
  std::vector<at::Tensor> out{group_->Staged(output, true)};
  std::vector<std::vector<at::Tensor>> in;
  if (rank() == 0) in.push_back(group_->Staged(inputs, true));
  ASYMPO_RETURN_IF_ERROR(Collective("scattering the optimizer state", options_.timeout,
                                    [&] { return group_->pg->scatter(out, in); }));
  CopyBack(out[0], output);
  return absl::OkStatus();
}

}  // namespace asympo::learner

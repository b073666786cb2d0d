// What publishing the weights after every step costs the trainer: the
// median training step time with no broadcast, with the learner's
// SnapshotPublisher (--broadcast_every 1: stage on the device, copy, CRC and
// announce on its own thread), and with everything done inline on the
// trainer thread (the way it was before), side by side in one run;
// the order of the modes rotates from round to round.
//
//   publish_bench --config tiny|100m [--device cpu|cuda] [--dtype float32|bfloat16]
//                 [--groups 8] [--responses 8] [--tokens 64] [--steps 10] [--rounds 3]
//                 [--malloc_tuned 1] [--modes stage|release] [--free_heap_limit_mib 256]
// Prints one JSON object per mode and round, then a markdown table of medians.
// --malloc_tuned 1 sets asympo-learner's glibc thresholds; --modes stage
// compares no publishing with staging alone (the trainer's share); --modes
// release compares no publishing without and with the release of freed heap
// memory (common/daemon/heap_release.h, checking every 2 s): as
// asympo-learner does it (only what requests can have left; none arrive
// here) and releasing every excess over --free_heap_limit_mib.
//
//   publish_bench --mode transfer --config qwen3-0.6b --device cuda --dtype bfloat16 [--reps 3]
// The parts of moving one snapshot, each timed alone (medians), and per
// billion parameters: staging on the device, the copy to pinned host memory
// (already laid out as the store's buckets), the same two with
// --snapshot_staging=host (host_staging: staged straight into the host
// buffer on the trainer's thread, no device buffer), the store's Publish of it
// (pack_crc: it adopts the buckets and takes their CRC-32C), loading into a
// receiver's spare model on
// the device, and the one-rank NCCL broadcast of the snapshot's bytes from
// host memory and straight from the device (where NCCL and a GPU are
// present). The gRPC wire itself is broadcast_bench's.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/types.h>

#include "bench/bench_flags.h"
#include "bench/bench_models.h"
#include "common/daemon/daemon_runtime.h"
#include "common/daemon/heap_release.h"
#include "common/model/device.h"
#include "common/model/model_io.h"
#include "learner_server/learner_metrics.h"
#include "learner_server/snapshot_publisher.h"
#include "learner_server/trainer/trainer.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"
#include "weight_broadcaster/nccl/nccl_transport.h"

namespace {

using asympo::bench::Flag;
using asympo::bench::FlagS;
using asympo::bench::Median;
using asympo::bench::WarmMedianSeconds;

using asympo::learner::QueuedGroup;

// What the timer waits for: the GPU's work, on a GPU.
std::function<void()> DeviceWait(bool cuda) {
  if (!cuda) return {};
  return [] { torch::cuda::synchronize(); };
}

// Random groups of `responses` responses of `tokens` tokens after an
// 8-token prompt, reward 1 on the first response.
std::vector<QueuedGroup> Groups(int64_t n, int64_t responses, int64_t tokens, int64_t vocab) {
  std::vector<QueuedGroup> out;
  for (int64_t g = 0; g < n; ++g) {
    QueuedGroup q;
    for (int t = 0; t < 8; ++t)
      q.group.add_prompt_tokens(static_cast<int32_t>((g * 31 + t) % vocab));
    for (int64_t r = 0; r < responses; ++r) {
      asympo::v1::Response* resp = q.group.add_responses();
      for (int64_t t = 0; t < tokens; ++t) {
        resp->add_tokens(static_cast<int32_t>((g * 131 + r * 17 + t * 7) % vocab));
      }
      resp->set_reward(r == 0 ? 1.0f : 0.0f);
    }
    out.push_back(q);
  }
  return out;
}

// The inline path: stage, copy, checksum and announce on the trainer thread.
class InlinePublisher : public asympo::learner::WeightPublisher {
 public:
  InlinePublisher(asympo::broadcast::SnapshotStore* store,
                  std::unique_ptr<asympo::broadcast::SnapshotStaging> staging)
      : store_(store), staging_(std::move(staging)) {}
  absl::Status Publish(uint64_t version, const asympo::PolicyModel& model,
                       const asympo::learner::WeightParts& parts) override {
    if (!parts([](const std::vector<size_t>&) { return absl::OkStatus(); }).ok() ||
        !staging_->Stage(model).ok() || !staging_->CopyToHost().ok() ||
        !store_->Publish(version, staging_->HostBucketsOfCopy()).ok()) {
      std::abort();
    }
    return absl::OkStatus();
  }

 private:
  asympo::broadcast::SnapshotStore* store_;
  std::unique_ptr<asympo::broadcast::SnapshotStaging> staging_;
};

// Only the trainer's part of publishing (diagnostics: --modes stage).
class StageOnlyPublisher : public asympo::learner::WeightPublisher {
 public:
  explicit StageOnlyPublisher(std::unique_ptr<asympo::broadcast::SnapshotStaging> staging)
      : staging_(std::move(staging)) {}
  absl::Status Publish(uint64_t, const asympo::PolicyModel& model,
                       const asympo::learner::WeightParts& parts) override {
    if (!parts([](const std::vector<size_t>&) { return absl::OkStatus(); }).ok() ||
        !staging_->Stage(model).ok()) {
      std::abort();
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<asympo::broadcast::SnapshotStaging> staging_;
};

struct Setup {
  std::string config;
  asympo::ModelOptions model;
  at::ScalarType dtype;
  int64_t groups, responses, tokens, steps;
  int64_t free_heap_limit_mib;
};

// Median step seconds of `steps` steps (after one warm-up step) in `mode`;
// `released_mib`: what the heap release gave back meanwhile.
double RunMode(const Setup& s, const std::string& mode, double* released_mib) {
  const asympo::ModelConfig cfg = asympo::bench::BenchConfig(s.config);
  auto model = asympo::PolicyModel::CreateRandom(cfg, s.model).value();
  prometheus::Registry publisher_metrics;  // not exported; outlives the store and publisher
  asympo::broadcast::SnapshotStore store({}, asympo::broadcast::ModelSignatureOf(*model, s.dtype),
                                         publisher_metrics);
  std::unique_ptr<asympo::learner::WeightPublisher> publisher;
  if (mode == "async") {
    publisher =
        asympo::learner::SnapshotPublisher::Create(
            &store, *model, s.dtype, asympo::learner::RegisterSnapshotCounters(publisher_metrics))
            .value();
  } else if (mode == "stage") {
    publisher = std::make_unique<StageOnlyPublisher>(
        asympo::broadcast::SnapshotStaging::Create(*model, s.dtype).value());
  } else if (mode == "inline") {
    publisher = std::make_unique<InlinePublisher>(
        &store, asympo::broadcast::SnapshotStaging::Create(*model, s.dtype, store, false).value());
  }
  prometheus::Registry registry;
  std::unique_ptr<asympo::daemon::HeapReleaser> releaser;
  if (mode == "release" || mode == "release_all") {
    asympo::daemon::HeapReleaseOptions ho;
    ho.keep_bytes = s.free_heap_limit_mib << 20;
    if (mode == "release") ho.received_bytes = [] { return int64_t{0}; };
    releaser = std::make_unique<asympo::daemon::HeapReleaser>(ho, registry, "asympo_bench");
  }
  asympo::learner::TrainerOptions to;
  to.lr.peak_lr = 1e-5;
  auto trainer = asympo::learner::Trainer::Create(to, model.get(), publisher.get()).value();
  const auto groups = Groups(s.groups, s.responses, s.tokens, cfg.vocab_size);
  const double median = WarmMedianSeconds(
      [&] {
        if (!trainer->Step(groups).ok()) std::abort();
      },
      s.steps, DeviceWait(s.model.device.is_cuda()));
  if (auto* p = dynamic_cast<asympo::learner::SnapshotPublisher*>(publisher.get())) p->Flush();
  *released_mib = 0;
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name == "asympo_bench_heap_released_bytes_total") {
      *released_mib = f.metric.at(0).counter.value / (1 << 20);
    }
  }
  return median;
}

void Must(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "publish_bench: %s\n", std::string(s.message()).c_str());
    std::abort();
  }
}

double Seconds(const std::function<void()>& fn, bool cuda, int reps) {
  return WarmMedianSeconds(fn, reps, DeviceWait(cuda));
}

// The one-rank NCCL broadcast of the snapshot's buckets straight from the
// staged device copy (what the learner does with --device cuda).
double NcclFromDevice(asympo::broadcast::NcclBroadcaster& comm, const asympo::PolicyModel& model,
                      at::ScalarType dtype, bool cuda, int reps) {
  const asympo::broadcast::PackingOptions packing;
  auto staging = asympo::broadcast::SnapshotStaging::Create(model, dtype, &packing).value();
  Must(staging->Stage(model));
  Must(staging->CopyToHost().status());
  const asympo::broadcast::DeviceBuckets device = staging->DeviceBucketsOfStage();
  const asympo::broadcast::SnapshotPlan& plan = staging->plan();
  return Seconds(
      [&] {
        for (int b = 0; b < plan.buckets(); ++b) {
          Must(comm.BroadcastFromDevice(
              static_cast<const char*>(device.data) + plan.bucket_start(b), plan.bucket_bytes(b)));
        }
      },
      cuda, reps);
}

// --mode transfer (see the top of the file).
int Transfer(const Setup& s, int reps) {
  const asympo::ModelConfig cfg = asympo::bench::BenchConfig(s.config);
  const bool cuda = s.model.device.is_cuda();
  auto model = asympo::PolicyModel::CreateRandom(cfg, s.model).value();
  asympo::ModelOptions spare_options = s.model;
  spare_options.dtype = s.dtype;
  spare_options.random_init = false;
  auto spare = asympo::PolicyModel::CreateRandom(cfg, spare_options).value();
  prometheus::Registry registry;  // not exported
  asympo::broadcast::SnapshotStore store({}, asympo::broadcast::ModelSignatureOf(*model, s.dtype),
                                         registry);
  // Laid out as the store's buckets: Publish adopts the host copy.
  auto staging = asympo::broadcast::SnapshotStaging::Create(*model, s.dtype, store, false).value();
  std::vector<asympo::broadcast::TensorView> views;
  uint64_t version = 0;
  const double stage = Seconds([&] { Must(staging->Stage(*model)); }, cuda, reps);
  const double copy = Seconds([&] { views = staging->CopyToHost().value(); }, cuda, reps);
  const double pack =
      Seconds([&] { Must(store.Publish(++version, staging->HostBucketsOfCopy())); }, cuda, reps);
  // --snapshot_staging=host: no device buffer; the trainer's thread stages
  // straight into the (pinned) host buffer, so the copy to the host is its.
  auto host_staging =
      asympo::broadcast::SnapshotStaging::Create(*model, s.dtype, store, false, /*host_only=*/true)
          .value();
  const double host_stage = Seconds(
      [&] {
        Must(host_staging->Stage(*model));
        Must(host_staging->CopyToHost().status());
      },
      cuda, reps);
  std::vector<std::pair<std::string, at::Tensor>> source;
  for (const auto& v : views) {
    source.emplace_back(v.spec.name, at::from_blob(const_cast<void*>(v.data), v.spec.shape,
                                                   at::TensorOptions().dtype(s.dtype)));
  }
  const double load = Seconds([&] { Must(spare->LoadParameters(source)); }, cuda, reps);
  double nccl = -1, nccl_device = -1;
  if (cuda) {
    auto id = asympo::broadcast::NewNcclUniqueId();
    auto comm =
        id.ok() ? asympo::broadcast::NcclBroadcaster::Create(
                      *id, 0, 1, std::max(0, int{s.model.device.index()}))
                : absl::StatusOr<std::unique_ptr<asympo::broadcast::NcclBroadcaster>>(id.status());
    if (comm.ok()) {
      void* bytes = const_cast<void*>(views.front().data);
      nccl = Seconds([&] { Must((*comm)->Broadcast(bytes, staging->bytes())); }, cuda, reps);
      nccl_device = NcclFromDevice(**comm, *model, s.dtype, cuda, reps);
    } else {
      std::fprintf(stderr, "publish_bench: no NCCL: %s\n",
                   std::string(comm.status().message()).c_str());
    }
  }
  const double per_billion = 1e9 / static_cast<double>(cfg.NumParameters());
  std::printf(
      "{\"mode\": \"transfer\", \"config\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", "
      "\"params\": %lld, \"bytes\": %lld, \"pinned\": %s, \"stage_s\": %.5f, \"copy_to_host_s\": "
      "%.5f, "
      "\"pack_crc_s\": %.5f, \"load_spare_s\": %.5f, \"nccl_one_rank_s\": %.5f, "
      "\"nccl_one_rank_from_device_s\": %.5f, \"host_staging_s\": %.5f, "
      "\"per_billion_s\": {\"stage\": %.5f, \"copy_to_host\": %.5f, \"host_staging\": %.5f, "
      "\"pack_crc\": %.5f, "
      "\"load_spare\": %.5f, \"nccl_one_rank\": %.5f, \"nccl_one_rank_from_device\": %.5f}}\n",
      s.config.c_str(), c10::DeviceTypeName(s.model.device.type(), true).c_str(),
      asympo::DTypeName(s.dtype).c_str(), static_cast<long long>(cfg.NumParameters()),
      static_cast<long long>(staging->bytes()), staging->pinned() ? "true" : "false", stage, copy,
      pack, load, nccl, nccl_device, host_stage, stage * per_billion, copy * per_billion,
      host_stage * per_billion, pack * per_billion, load * per_billion,
      nccl < 0 ? -1.0 : nccl * per_billion, nccl_device < 0 ? -1.0 : nccl_device * per_billion);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (Flag(argc, argv, "--malloc_tuned", 0) != 0) asympo::daemon::RetainFreedMemory();
  asympo::SetCpuThreads(static_cast<int>(Flag(argc, argv, "--threads", 2)));
  Setup s;
  s.config = FlagS(argc, argv, "--config", "tiny");
  s.model.seed = 1;
  s.model.device = asympo::ParseDevice(FlagS(argc, argv, "--device", "cpu")).value();
  s.model.compute_dtype =
      asympo::ParseComputeDType(FlagS(argc, argv, "--compute_dtype", "auto"), s.model.device)
          .value();
  s.dtype = asympo::ParseModelDType(FlagS(argc, argv, "--dtype", "float32")).value();
  s.groups = Flag(argc, argv, "--groups", 8);
  s.responses = Flag(argc, argv, "--responses", 8);
  s.tokens = Flag(argc, argv, "--tokens", 64);
  s.steps = Flag(argc, argv, "--steps", 10);
  const bool transfer = FlagS(argc, argv, "--mode", "steps") == "transfer";
  const int reps = static_cast<int>(Flag(argc, argv, "--reps", 3));
  const int64_t rounds = Flag(argc, argv, "--rounds", 3);
  std::vector<std::string> modes = {"none", "async", "inline"};
  if (FlagS(argc, argv, "--modes", "") == "stage") modes = {"none", "stage"};
  if (FlagS(argc, argv, "--modes", "") == "release") modes = {"none", "release", "release_all"};
  s.free_heap_limit_mib = Flag(argc, argv, "--free_heap_limit_mib", 256);
  asympo::bench::RejectUnknownFlags(argc, argv);
  if (transfer) return Transfer(s, reps);
  std::map<std::string, std::vector<double>> medians;
  for (int64_t r = 0; r < rounds; ++r) {
    // Each round starts with another mode, so that no mode always runs
    // first (right after the previous model was torn down).
    for (size_t k = 0; k < modes.size(); ++k) {
      const std::string& mode = modes[(k + static_cast<size_t>(r)) % modes.size()];
      double released_mib = 0;
      const double m = RunMode(s, mode, &released_mib);
      medians[mode].push_back(m);
      std::printf(
          "{\"config\": \"%s\", \"mode\": \"%s\", \"round\": %lld, \"step_s\": %.5f, "
          "\"released_mib\": %.1f}\n",
          s.config.c_str(), mode.c_str(), static_cast<long long>(r), m, released_mib);
    }
  }
  const double base = Median(medians["none"]);
  std::printf("\n| publishing (config %s, %s, snapshot %s) | median step | vs none |\n",
              s.config.c_str(), c10::DeviceTypeName(s.model.device.type()).c_str(),
              asympo::DTypeName(s.dtype).c_str());
  std::printf("| --- | ---: | ---: |\n");
  const std::map<std::string, std::string> names = {
      {"none", "none (--broadcast_every 0)"},
      {"async", "--broadcast_every 1 (SnapshotPublisher)"},
      {"inline", "every step, inline on the trainer thread"},
      {"stage", "stage only (the trainer's part)"},
      {"release", "none, with asympo-learner's heap release"},
      {"release_all", "none, releasing all freed heap memory above --free_heap_limit_mib"}};
  for (const std::string& mode : modes) {
    const double m = Median(medians[mode]);
    std::printf("| %s | %.1f ms | %.3fx |\n", names.at(mode).c_str(), 1e3 * m, m / base);
  }
  return 0;
}

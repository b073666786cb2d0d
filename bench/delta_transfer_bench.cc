// Delta versions end to end, side by side in one run: a model of --config
// trains with AdamW at each learning rate (the same random start and
// batches for every lr; --warmup_steps first, so that the moments are past
// AdamW's first steps, where every element moves by the whole lr), and each
// following version, staged in --dtype as the learner stages it, is
// published to four learners' weight broadcasters on loopback: whole
// versions (--weight_deltas off) and delta versions, each with 1 and with 2
// receivers (WeightReceivers, one channel each, as rollout daemons). Per
// version: the fraction of words that changed, the bytes a receiver fetches
// (the delta and the buckets that travel whole, against the whole version),
// the publish (pack into the store's buckets, CRC-32C, and the delta's
// encoding) and the time from the start of the publish to the last receiver
// holding the version verified. Medians over the versions; seconds also per
// billion parameters. One endpoint at a time is busy.
//
//   delta_transfer_bench [--config 100m] [--lrs 1e-6,1e-5,1e-4] [--warmup_steps 20]
//                        [--steps 4] [--dtype bfloat16] [--step_tokens 1152] [--sequence 72]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>
#include <torch/types.h>

#include "bench/bench_flags.h"
#include "bench/bench_models.h"
#include "bench/step_groups.h"
#include "learner_server/trainer/trainer.h"
#include "weight_broadcaster/broadcast_receiver.h"
#include "weight_broadcaster/broadcast_sender.h"
#include "weight_broadcaster/delta_codec.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"

namespace {

namespace bc = asympo::broadcast;
using asympo::bench::Flag;
using asympo::bench::FlagS;
using asympo::bench::Median;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "delta_transfer_bench: %s\n", what.c_str());
  std::exit(1);
}

// A learner's weight broadcaster on a loopback port with its receivers.
class Endpoint {
 public:
  Endpoint(bool deltas, int receivers, const std::string& signature) : deltas_(deltas) {
    bc::SnapshotStoreOptions so;
    so.incarnation = "bench";
    so.delta_keyframe_every = deltas ? 1000000 : 0;
    store_ = std::make_unique<bc::SnapshotStore>(so, signature, registry_);
    sender_ =
        std::make_unique<bc::BroadcastSender>(bc::BroadcastSenderOptions{}, *store_, registry_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(sender_.get());
    server_ = builder.BuildAndStart();
    for (int i = 0; i < receivers; ++i) {
      bc::WeightReceiverOptions o;
      o.target = "127.0.0.1:" + std::to_string(port);
      o.receiver_id = "rx-" + std::to_string(i);
      o.model_signature = signature;
      o.min_backoff = absl::Milliseconds(10);
      o.max_backoff = absl::Milliseconds(100);
      o.deltas = deltas;
      rx_registries_.push_back(std::make_unique<prometheus::Registry>());
      rx_.push_back(bc::WeightReceiver::Start(o, *rx_registries_.back()).value());
    }
  }
  ~Endpoint() {
    for (auto& r : rx_) r->Stop();
    rx_.clear();
    sender_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
  }

  // Publishes and waits for every receiver to hold `version`, verified:
  // the publish's seconds and the whole time, from the publish's start.
  void Publish(uint64_t version, const std::vector<bc::TensorView>& views, double* publish_s,
               double* verified_s) {
    const auto t0 = Clock::now();
    if (absl::Status s = store_->Publish(version, views); !s.ok()) Die(s.ToString());
    *publish_s = Since(t0);
    for (auto& r : rx_) {
      if (!r->WaitForPending(absl::Seconds(120))) Die("a receiver did not get a version");
      std::shared_ptr<const bc::ReceivedSnapshot> got = r->TakePending();
      if (got == nullptr || got->version() != version) Die("a receiver got another version");
      r->ReportLoaded(version);
    }
    *verified_s = Since(t0);
  }
  // What a receiver holding the version before fetches of the latest.
  uint64_t FetchedBytes() const {
    std::shared_ptr<const bc::Snapshot> s = store_->latest();
    return deltas_ && s->delta != nullptr ? s->delta->bytes : s->manifest().total_bytes();
  }

 private:
  const bool deltas_;
  prometheus::Registry registry_;
  std::unique_ptr<bc::SnapshotStore> store_;
  std::unique_ptr<bc::BroadcastSender> sender_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<prometheus::Registry>> rx_registries_;
  std::vector<std::unique_ptr<bc::WeightReceiver>> rx_;
};

// The fraction of words of `cur` that differ from `prev`.
double Changed(const std::vector<uint8_t>& prev, const uint8_t* cur, int word) {
  std::string delta;
  if (!bc::EncodeDelta(prev.data(), cur, prev.size(), word, &delta).ok()) Die("encode");
  bc::DeltaHeader h;
  if (!bc::ReadDeltaHeader(delta, &h).ok()) Die("header");
  return static_cast<double>(h.changed) / static_cast<double>(h.words);
}

struct Cells {
  std::vector<double> changed, ratio, publish[2], verified[2][2];
};

void PrintLr(double lr, const Cells& c, double params) {
  const double per_b = 1e9 / params;
  std::printf("| %g | %.2f%% | %.4f (%.1fx) | %.3f | %.3f |", lr, 100 * Median(c.changed),
              Median(c.ratio), 1 / Median(c.ratio), Median(c.publish[0]), Median(c.publish[1]));
  for (int rx = 0; rx < 2; ++rx) {
    for (int m = 0; m < 2; ++m) {
      std::printf(" %.3f (%.3f/B) |", Median(c.verified[m][rx]), Median(c.verified[m][rx]) * per_b);
    }
  }
  std::printf("\n");
  std::fflush(stdout);
}

struct Args {
  asympo::ModelConfig cfg;
  at::ScalarType dtype = at::kBFloat16;
  int64_t warmup = 0, steps = 0, step_tokens = 0, sequence = 0;
};

// One learning rate: warm-up, then every version to the four endpoints.
Cells MeasureLr(double lr, const Args& a) {
  asympo::ModelOptions mo;
  mo.seed = 1;
  auto model = asympo::PolicyModel::CreateRandom(a.cfg, mo).value();
  asympo::learner::TrainerOptions to;
  to.lr.peak_lr = lr;
  auto trainer = asympo::learner::Trainer::Create(to, model.get(), nullptr).value();
  auto staging = bc::SnapshotStaging::Create(*model, a.dtype).value();
  std::mt19937 rng(7);  // the same batches for every lr
  auto train = [&] {
    const auto step =
        asympo::bench::UniformStepGroups(1, a.step_tokens, a.sequence, a.cfg.vocab_size, rng);
    if (!trainer->Step(step).ok()) Die("a training step failed");
  };
  auto stage = [&] {
    if (!staging->Stage(*model).ok()) Die("stage");
    return staging->CopyToHost().value();
  };
  for (int64_t s = 0; s < a.warmup; ++s) train();
  std::vector<bc::TensorView> views = stage();
  std::vector<bc::TensorSpec> specs;
  for (const bc::TensorView& v : views) specs.push_back(v.spec);
  std::unique_ptr<Endpoint> ends[2][2];  // [whole, delta][1, 2 receivers]
  for (int m = 0; m < 2; ++m) {
    for (int rx = 0; rx < 2; ++rx) {
      ends[m][rx] = std::make_unique<Endpoint>(m == 1, rx + 1, bc::ModelSignature(specs));
    }
  }
  double p = 0, v = 0;
  for (auto& row : ends)
    for (auto& e : row) e->Publish(1, views, &p, &v);  // the base: whole everywhere
  const char* host = staging->HostBucketsOfCopy().data;
  std::vector<uint8_t> prev(host, host + staging->bytes());
  Cells cells;
  for (int64_t s = 0; s < a.steps; ++s) {
    train();
    views = stage();
    host = staging->HostBucketsOfCopy().data;
    cells.changed.push_back(
        Changed(prev, reinterpret_cast<const uint8_t*>(host), a.dtype == at::kBFloat16 ? 2 : 4));
    prev.assign(host, host + staging->bytes());
    for (int m = 0; m < 2; ++m) {
      for (int rx = 0; rx < 2; ++rx) {
        ends[m][rx]->Publish(static_cast<uint64_t>(s) + 2, views, &p, &v);
        if (rx == 0) cells.publish[m].push_back(p);
        cells.verified[m][rx].push_back(v);
      }
    }
    cells.ratio.push_back(static_cast<double>(ends[1][0]->FetchedBytes()) /
                          static_cast<double>(ends[0][0]->FetchedBytes()));
  }
  return cells;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string config = FlagS(argc, argv, "--config", "100m");
  const std::string lrs = FlagS(argc, argv, "--lrs", "1e-6,1e-5,1e-4");
  Args a;
  a.warmup = Flag(argc, argv, "--warmup_steps", 20);
  a.steps = Flag(argc, argv, "--steps", 4);
  const std::string dtype_name = FlagS(argc, argv, "--dtype", "bfloat16");
  a.step_tokens = Flag(argc, argv, "--step_tokens", 1152);
  a.sequence = Flag(argc, argv, "--sequence", 72);
  asympo::bench::RejectUnknownFlags(argc, argv);
  if ((dtype_name != "bfloat16" && dtype_name != "float32") || a.steps < 1 || a.warmup < 0 ||
      a.sequence < 4 || a.step_tokens < 2 * a.sequence) {
    Die("--dtype bfloat16 or float32, --steps >= 1, --warmup_steps >= 0, --sequence >= 4, "
        "--step_tokens at least two sequences");
  }
  a.dtype = dtype_name == "bfloat16" ? at::kBFloat16 : at::kFloat;
  a.cfg = asympo::bench::BenchConfig(config);
  std::printf("%s, %s snapshots, %lld warm-up steps then %lld versions per lr of %lld tokens\n\n",
              config.c_str(), dtype_name.c_str(), static_cast<long long>(a.warmup),
              static_cast<long long>(a.steps), static_cast<long long>(a.step_tokens));
  std::printf(
      "| lr | words changed | fetched / whole | publish s, whole | publish s, delta | "
      "verified s, 1 rx, whole | 1 rx, delta | 2 rx, whole | 2 rx, delta |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::fflush(stdout);
  std::stringstream list(lrs);
  for (std::string item; std::getline(list, item, ',');) {
    const double lr = std::strtod(item.c_str(), nullptr);
    if (!(lr > 0)) Die("--lrs: \"" + item + "\" is not a positive number");
    PrintLr(lr, MeasureLr(lr, a), static_cast<double>(a.cfg.NumParameters()));
  }
  return 0;
}

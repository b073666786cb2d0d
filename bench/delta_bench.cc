// How much of a bfloat16 snapshot changes between two versions of real
// training, and what a delta of it costs: per learning rate, a model of
// --config trains --warmup_steps steps, then --steps steps (AdamW, constant
// lr, the same random start and batches for every lr); after each of the
// latter its snapshot is staged
// in --dtype as the learner stages it, and compared with the previous one:
// the fraction of words that changed, the delta's size against the full
// version (weight_broadcaster/delta_codec.h: gaps or bitmap, whichever is
// smaller, plus the changed values), its encode and apply speed (the applied
// bucket checked bit-exact), and, for comparison, XOR with the previous
// version compressed by zlib at level 1. Medians over the steps. A step is
// --step_tokens tokens of random groups in sequences of --sequence
// (bench/step_groups.h), the same for every lr.
//
//   delta_bench [--config 100m] [--lrs 1e-6,1e-5,1e-4] [--warmup_steps 0] [--steps 4]
//               [--dtype bfloat16] [--step_tokens 1152] [--sequence 72]
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <torch/types.h>

#include "bench/bench_flags.h"
#include "bench/bench_models.h"
#include "bench/step_groups.h"
#include "learner_server/trainer/trainer.h"
#include "weight_broadcaster/delta_codec.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"

namespace {

using asympo::bench::Flag;
using asympo::bench::FlagS;
using asympo::bench::Median;
using asympo::bench::SecondsOf;

struct Rates {
  std::vector<double> changed, delta_ratio, encode_gbs, apply_gbs, zlib_ratio, zlib_gbs;
};

// The staged snapshot's bytes.
std::vector<uint8_t> Snapshot(asympo::broadcast::SnapshotStaging* staging,
                              const asympo::PolicyModel& model) {
  if (!staging->Stage(model).ok() || !staging->CopyToHost().ok()) std::abort();
  const char* data = staging->HostBucketsOfCopy().data;
  return std::vector<uint8_t>(data, data + staging->bytes());
}

void Compare(const std::vector<uint8_t>& prev, const std::vector<uint8_t>& cur, int word,
             Rates* r) {
  const double bytes = static_cast<double>(cur.size());
  std::string delta;
  const double enc = SecondsOf([&] {
    if (!asympo::broadcast::EncodeDelta(prev.data(), cur.data(), cur.size(), word, &delta).ok()) {
      std::abort();
    }
  });
  std::vector<uint8_t> out(cur.size());
  const double app = SecondsOf([&] {
    if (!asympo::broadcast::ApplyDelta(prev.data(), delta, out.data(), out.size()).ok())
      std::abort();
  });
  if (out != cur) {
    std::fprintf(stderr, "the applied delta is not the version\n");
    std::abort();
  }
  asympo::broadcast::DeltaHeader h;
  if (!asympo::broadcast::ReadDeltaHeader(delta, &h).ok()) std::abort();
  std::vector<uint8_t> x(cur.size());
  uLongf packed = compressBound(static_cast<uLong>(x.size()));
  std::vector<Bytef> z(packed);
  const double zs = SecondsOf([&] {
    for (size_t i = 0; i < x.size(); ++i) x[i] = prev[i] ^ cur[i];
    if (compress2(z.data(), &packed, x.data(), static_cast<uLong>(x.size()), 1) != Z_OK)
      std::abort();
  });
  r->changed.push_back(static_cast<double>(h.changed) / static_cast<double>(h.words));
  r->delta_ratio.push_back(static_cast<double>(delta.size()) / bytes);
  r->encode_gbs.push_back(bytes / enc / 1e9);
  r->apply_gbs.push_back(bytes / app / 1e9);
  r->zlib_ratio.push_back(static_cast<double>(packed) / bytes);
  r->zlib_gbs.push_back(bytes / zs / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string config = FlagS(argc, argv, "--config", "100m");
  const std::string lrs = FlagS(argc, argv, "--lrs", "1e-6,1e-5,1e-4");
  const int64_t warmup = Flag(argc, argv, "--warmup_steps", 0);
  const int64_t steps = Flag(argc, argv, "--steps", 4);
  const std::string dtype_name = FlagS(argc, argv, "--dtype", "bfloat16");
  const int64_t step_tokens = Flag(argc, argv, "--step_tokens", 1152);
  const int64_t sequence = Flag(argc, argv, "--sequence", 72);
  asympo::bench::RejectUnknownFlags(argc, argv);
  if (dtype_name != "bfloat16" && dtype_name != "float32") {
    std::fprintf(stderr, "--dtype bfloat16 or float32, not %s\n", dtype_name.c_str());
    return 2;
  }
  if (steps < 1 || warmup < 0 || sequence < 4 || step_tokens < 2 * sequence) {
    std::fprintf(stderr,
                 "--steps must be positive, --sequence at least 4 and --step_tokens at least two "
                 "sequences\n");
    return 2;
  }
  const at::ScalarType dtype = dtype_name == "bfloat16" ? at::kBFloat16 : at::kFloat;
  const int word = dtype == at::kBFloat16 ? 2 : 4;
  const asympo::ModelConfig cfg = asympo::bench::BenchConfig(config);
  std::printf(
      "%s, %s snapshots, %lld warm-up steps, then %lld steps per lr of %lld tokens in "
      "sequences of %lld\n\n",
      config.c_str(), dtype_name.c_str(), static_cast<long long>(warmup),
      static_cast<long long>(steps), static_cast<long long>(step_tokens),
      static_cast<long long>(sequence));
  std::printf(
      "| lr | words changed | delta / full | encode GB/s | apply GB/s | XOR+zlib-1 / full | "
      "XOR+zlib-1 GB/s |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::stringstream list(lrs);
  for (std::string item; std::getline(list, item, ',');) {
    const double lr = std::strtod(item.c_str(), nullptr);
    if (!(lr > 0)) {
      std::fprintf(stderr, "--lrs: \"%s\" is not a positive number\n", item.c_str());
      return 2;
    }
    asympo::ModelOptions mo;
    mo.seed = 1;
    auto model = asympo::PolicyModel::CreateRandom(cfg, mo).value();
    asympo::learner::TrainerOptions to;
    to.lr.peak_lr = lr;
    auto trainer = asympo::learner::Trainer::Create(to, model.get(), nullptr).value();
    auto staging = asympo::broadcast::SnapshotStaging::Create(*model, dtype).value();
    Rates r;
    std::mt19937 rng(7);  // the same batches for every lr
    for (int64_t s = 0; s < warmup; ++s) {
      const auto step =
          asympo::bench::UniformStepGroups(1, step_tokens, sequence, cfg.vocab_size, rng);
      if (!trainer->Step(step).ok()) std::abort();
    }
    std::vector<uint8_t> prev = Snapshot(staging.get(), *model);
    for (int64_t s = 0; s < steps; ++s) {
      const auto step =
          asympo::bench::UniformStepGroups(1, step_tokens, sequence, cfg.vocab_size, rng);
      if (!trainer->Step(step).ok()) std::abort();
      std::vector<uint8_t> cur = Snapshot(staging.get(), *model);
      Compare(prev, cur, word, &r);
      prev.swap(cur);
    }
    std::printf("| %g | %.3f%% | %.4f | %.2f | %.2f | %.4f | %.2f |\n", lr, 100 * Median(r.changed),
                Median(r.delta_ratio), Median(r.encode_gbs), Median(r.apply_gbs),
                Median(r.zlib_ratio), Median(r.zlib_gbs));
    std::fflush(stdout);
  }
  return 0;
}

// One rank of a data-parallel training run on fixed synthetic groups, for
// tests/integration/data_parallel_test.py: with --world 1 it is the single
// process; with more, every rank runs this program and rank 0 splits each
// step's groups across them (DataParallel, Gloo on loopback). After every
// step each rank writes its weights (float32, parameter order) to
// OUT/r<rank>_s<step>.bin and a line of the step's diagnostics to
// OUT/r<rank>.csv.
//
//   data_parallel_rank --world N --rank R --port P --steps S --objective O --out DIR
//                      [--fault_nan_step K]   (this rank's Kth step gets a NaN loss)
//                      [--shard 1|2]          (1: ZeRO-1, the AdamW moments sharded;
//                                              2: full sharding, weights and gradients too:
//                                              only rank 0 writes weights, gathered)
//                      [--first_step K]       (train steps K..S; default 1)
//                      [--resume CKPT_ROOT]   (every rank reads its part of the newest
//                                              checkpoint, as asympo-learner's ranks do)
//                      [--save CKPT_ROOT]     (every rank writes its part of a checkpoint
//                                              after the last step)
//                      [--save_every K]       (and after every Kth step, keeping the
//                                              newest 3)
//                      [--backend gloo|nccl]  (the collectives; given, even a world of one
//                                              rank goes through DataParallel)
//                      [--device cpu|cuda]    (the model's; NCCL needs cuda; LOCAL_RANK picks
//                                              the GPU as in asympo-learner)
//                      [--lora_rank R]        (train rank-R adapters on every projection, alpha
//                                              2R; the weights written are the adapters)
//                      [--publish_peak FILE]  (--shard 2: after the last step, every rank
//                                              publishes a version as the learner does, a unit
//                                              at a time, rank 0 into a snapshot staging; each
//                                              writes FILE.<rank>: the peak of its tensor memory
//                                              during that and during a whole-model gather,
//                                              with the largest unit, as JSON)
//                      [--staging device|host] (rank 0's staging: --snapshot_staging)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include "common/model/device.h"
#include "common/status_macros.h"
#include "learner_server/parallel/data_parallel.h"
#include "learner_server/trainer/checkpoint.h"
#include "learner_server/trainer/trainer.h"
#include "tests/testing/counting_allocator.h"
#include "weight_broadcaster/model_weights/model_snapshot.h"
#include "weight_broadcaster/snapshot_store.h"

namespace asympo::learner {
namespace {

// Step `step`'s groups: 5 groups of 2-5 responses of 1-6 tokens (with
// behavior log-probs) after 2-5 prompt tokens, random rewards, and one group
// whose rewards are all equal.
std::vector<QueuedGroup> GroupsOf(int step) {
  std::mt19937 rng(1000 + step);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::mt19937 behavior(2000 + step);
  std::vector<QueuedGroup> out;
  for (int g = 0; g < 5; ++g) {
    QueuedGroup q;
    q.arrival_version = static_cast<uint64_t>(step);
    q.group.set_prompt_id("s" + std::to_string(step) + "g" + std::to_string(g));
    const int prompt = uniform(2, 5);
    for (int t = 0; t < prompt; ++t) q.group.add_prompt_tokens(uniform(1, 31));
    const int responses = uniform(2, 5);
    for (int r = 0; r < responses; ++r) {
      v1::Response* resp = q.group.add_responses();
      const int len = uniform(1, 6);
      for (int t = 0; t < len; ++t) {
        resp->add_tokens(uniform(1, 31));
        // grpo's, from a generator of their own: the other draws stay as
        // they were before grpo was tested.
        resp->add_behavior_logprobs(-0.1f * static_cast<float>(1 + behavior() % 30));
      }
      resp->set_reward(g == 2 ? 0.5f : static_cast<float>(uniform(0, 4)) / 4.0f);
      q.tokens += prompt + len;
    }
    out.push_back(std::move(q));
  }
  return out;
}

// --publish_peak: rank 0 stages into `staging` (null elsewhere) a unit at a
// time, every rank's tensor memory counted; then the whole-model gather.
absl::Status PublishPeak(const std::string& file, int rank, PolicyModel& model, Trainer& trainer,
                         broadcast::SnapshotStaging* staging) {
  int64_t by_units = 0, whole_gather = 0;
  {
    ::asympo::testing::CountingAllocator::Installed counting;
    counting->Reset();
    if (staging != nullptr) ASYMPO_RETURN_IF_ERROR(staging->BeginStage());
    ASYMPO_RETURN_IF_ERROR(trainer.VisitWeightParts([&](const std::vector<size_t>& params) {
      return staging != nullptr ? staging->StageParameters(model, params) : absl::OkStatus();
    }));
    if (staging != nullptr) {
      ASYMPO_RETURN_IF_ERROR(staging->FinishStage());
      ASYMPO_RETURN_IF_ERROR(staging->CopyToHost().status());
    }
    by_units = counting->PeakAbove();
    counting->Reset();
    ASYMPO_RETURN_IF_ERROR(trainer.stepper().GatherWeights());
    whole_gather = counting->PeakAbove();
    trainer.stepper().ReleaseWeights();
  }
  std::ofstream out(file + "." + std::to_string(rank));
  out << "{\"rank\": " << rank << ", \"by_units\": " << by_units
      << ", \"whole_gather\": " << whole_gather
      << ", \"largest_unit\": " << 4 * trainer.full_shard()->largest_unit()
      << ", \"whole\": " << 4 * model.config().NumParameters() << "}\n";
  return out.good() ? absl::OkStatus() : absl::InternalError("cannot write " + file);
}

int Die(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  return 1;
}

// Every rank writes its part of a checkpoint of the current version.
absl::Status Save(const std::string& root, const PolicyModel& model, Trainer& trainer,
                  const CheckpointRanks& ranks) {
  CheckpointSave cs;
  cs.root = root;
  cs.version = trainer.version();
  return SaveCheckpoint(cs, model, trainer.stepper(), ranks).status();
}

int Run(int argc, char** argv) {
  int world = 1, rank = 0, port = 29500, steps = 4, nan_step = 0, shard = 0, first_step = 1;
  int save_every = 0, lora_rank = 0;
  std::string objective = "asympo_stable", out = ".", resume, save, backend, device = "cpu";
  std::string publish_peak, staging_mode = "device";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--world")
      world = std::atoi(v.c_str());
    else if (k == "--rank")
      rank = std::atoi(v.c_str());
    else if (k == "--port")
      port = std::atoi(v.c_str());
    else if (k == "--steps")
      steps = std::atoi(v.c_str());
    else if (k == "--objective")
      objective = v;
    else if (k == "--out")
      out = v;
    else if (k == "--fault_nan_step")
      nan_step = std::atoi(v.c_str());
    else if (k == "--shard")
      shard = std::atoi(v.c_str());
    else if (k == "--first_step")
      first_step = std::atoi(v.c_str());
    else if (k == "--resume")
      resume = v;
    else if (k == "--save")
      save = v;
    else if (k == "--save_every")
      save_every = std::atoi(v.c_str());
    else if (k == "--backend")
      backend = v;
    else if (k == "--device")
      device = v;
    else if (k == "--lora_rank")
      lora_rank = std::atoi(v.c_str());
    else if (k == "--publish_peak")
      publish_peak = v;
    else if (k == "--staging")
      staging_mode = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  asympo::SetCpuThreads(1);
  ModelOptions mo;
  mo.seed = 11;
  mo.lora.rank = lora_rank;
  mo.lora.alpha = 2.0 * lora_rank;
  mo.lora.targets = kAllLoraTargets;
  const absl::StatusOr<std::string> rank_device = RankDevice(
      device, [](const char* name) { return static_cast<const char*>(std::getenv(name)); });
  if (!rank_device.ok()) return Die(std::string(rank_device.status().message()));
  const absl::StatusOr<at::Device> parsed = ParseDevice(*rank_device);
  if (!parsed.ok()) return Die(std::string(parsed.status().message()));
  mo.device = *parsed;
  std::unique_ptr<PolicyModel> model = PolicyModel::CreateRandom(ModelConfig::Tiny(32), mo).value();
  TrainerOptions to;
  to.loss.objective = ParseObjective(objective).value();
  to.lr.peak_lr = 1e-3;
  to.micro_batch_tokens = 48;  // several micro-batches per rank
  if (nan_step > 0) to.fault_nonfinite_loss_steps = {nan_step};
  std::unique_ptr<Trainer> trainer = Trainer::Create(to, model.get(), nullptr).value();
  // Laid out while the weights are whole, as the learner's publisher is.
  prometheus::Registry registry;
  broadcast::SnapshotStore store({}, broadcast::ModelSignatureOf(*model, at::kBFloat16), registry);
  std::unique_ptr<broadcast::SnapshotStaging> staging;
  if (!publish_peak.empty() && rank == 0) {
    staging = broadcast::SnapshotStaging::Create(*model, at::kBFloat16, store, false,
                                                 staging_mode == "host")
                  .value();
  }
  std::unique_ptr<DataParallel> dp;
  if (world > 1 || !backend.empty()) {
    DataParallelFlags f;
    f.world_size = world, f.rank = rank, f.master_port = port, f.insecure = true;
    f.master_addr = "127.0.0.1";
    f.timeout = absl::Seconds(30);
    f.backend = backend.empty() ? "gloo" : backend;
    f.device = mo.device;
    const absl::StatusOr<DataParallelOptions> o =
        ResolveDataParallel(f, [](const char*) -> const char* { return nullptr; });
    if (!o.ok()) return Die(std::string(o.status().message()));
    absl::StatusOr<std::unique_ptr<DataParallel>> created = DataParallel::Create(*o);
    if (!created.ok()) return Die(std::string(created.status().message()));
    dp = *std::move(created);
    uint64_t version = trainer->version();
    if (absl::Status s = dp->BroadcastState(model.get(), &trainer->optimizer(), &version, !shard);
        !s.ok()) {
      return Die(std::string(s.message()));
    }
    trainer->set_version(version);
    if (shard != 0) {
      const absl::Status s =
          shard == 2 ? trainer->ShardFully(dp.get()) : trainer->ShardOptimizer(dp.get());
      if (!s.ok()) return Die(std::string(s.message()));
    }
  }
  CheckpointRanks ranks;
  ranks.collectives = dp.get();
  ranks.dist_shard = shard == 2 ? "full" : shard == 1 ? "optimizer" : "none";
  if (!resume.empty()) {  // every rank reads its part
    const absl::StatusOr<std::optional<CheckpointInfo>> info =
        LoadLatestCheckpoint(resume, *model, &trainer->stepper(), ranks);
    if (!info.ok()) return Die(std::string(info.status().message()));
    if (!info->has_value()) return Die("no checkpoint under " + resume);
    trainer->set_version((*info)->version);
  }
  std::FILE* csv = std::fopen((out + "/r" + std::to_string(rank) + ".csv").c_str(), "w");
  for (int step = first_step; step <= steps; ++step) {
    StepOr<StepResult> r;
    if (dp == nullptr) {
      r = trainer->Step(GroupsOf(step));
    } else if (rank == 0) {
      StepMessage m = dp->SendStep(GroupsOf(step)).value();
      r = trainer->StepShard(m.shard, m.totals, dp.get());
    } else {
      StepMessage m = dp->Receive().value();
      r = trainer->StepShard(m.shard, m.totals, dp.get());
    }
    if (r.ok()) {
      const LossDiagnostics& d = r->diagnostics;
      std::fprintf(csv, "%d,ok,%llu,%.9g,%.9g,%.9g,%.9g,%.9g,%lld,%lld\n", step,
                   static_cast<unsigned long long>(r->version), d.loss, d.reward_mean, r->grad_norm,
                   d.s_pos, d.s_neg, static_cast<long long>(d.responses),
                   static_cast<long long>(r->tokens));
    } else {
      std::fprintf(csv, "%d,skipped,%llu,%s\n", step,
                   static_cast<unsigned long long>(trainer->version()),
                   std::string(SkipReasonLabel(r.reason())).c_str());
    }
    // Fully sharded, the weights are whole on rank 0 only, when gathered.
    if (shard == 2) {
      if (absl::Status s = trainer->stepper().GatherWeights(); !s.ok()) {
        return Die(std::string(s.message()));
      }
    }
    if (shard != 2 || rank == 0) {
      std::ofstream w(out + "/r" + std::to_string(rank) + "_s" + std::to_string(step) + ".bin",
                      std::ios::binary);
      for (const at::Tensor& p : model->parameters()) {
        const at::Tensor c = p.detach().cpu().contiguous();
        w.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
      }
    }
    if (shard == 2) trainer->stepper().ReleaseWeights();
    if (save_every > 0 && step % save_every == 0 && step < steps) {
      if (absl::Status s = Save(save, *model, *trainer, ranks); !s.ok()) {
        return Die(std::string(s.message()));
      }
    }
  }
  std::fclose(csv);
  if (!publish_peak.empty()) {
    if (shard != 2) return Die("--publish_peak needs --shard 2");
    if (absl::Status s = PublishPeak(publish_peak, rank, *model, *trainer, staging.get());
        !s.ok()) {
      return Die(std::string(s.message()));
    }
  }
  if (!save.empty()) {
    if (absl::Status s = Save(save, *model, *trainer, ranks); !s.ok()) {
      return Die(std::string(s.message()));
    }
  }
  return 0;
}

}  // namespace
}  // namespace asympo::learner

int main(int argc, char** argv) { return asympo::learner::Run(argc, argv); }

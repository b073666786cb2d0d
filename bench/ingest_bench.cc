// Learner ingest throughput: 4 clients stream rollout batches over loopback
// to (a) the Learner service, which validates and queues every batch while a
// consumer drains the queue, and (b) a bare service on the same proto that
// reads the same messages and does nothing with them. Same run, same bytes.
// Then the learner's memory with a full queue, against the documented bound.
//
//   ingest_bench [--clients 4] [--batches 400] [--groups 16] [--responses 8]
//                [--tokens 256] [--queue 256]
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "learner_server/group_queue.h"
#include "learner_server/learner_metrics.h"
#include "learner_server/learner_service.h"

namespace {

using asympo::learner::GroupQueue;
using asympo::learner::LearnerCounters;
using asympo::learner::LearnerService;
namespace v1 = asympo::v1;

int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  }
  return def;
}

// Reads every streamed batch and discards it.
class BareSink final : public v1::Learner::CallbackService {
  grpc::ServerReadReactor<v1::RolloutBatch>* SubmitStream(grpc::CallbackServerContext*,
                                                          v1::SubmitResponse* r) override {
    class Reader : public grpc::ServerReadReactor<v1::RolloutBatch> {
     public:
      explicit Reader(v1::SubmitResponse* r) : r_(r) { StartRead(&b_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        r_->set_accepted_batches(r_->accepted_batches() + 1);
        StartRead(&b_);
      }
      void OnDone() override { delete this; }

     private:
      v1::SubmitResponse* r_;
      v1::RolloutBatch b_;
    };
    return new Reader(r);
  }
};

v1::RolloutBatch MakeBatch(int groups, int responses, int tokens, int vocab) {
  v1::RolloutBatch b;
  b.set_source("bench");
  for (int g = 0; g < groups; ++g) {
    v1::PromptGroup* pg = b.add_groups();
    pg->set_prompt_id("prompt-" + std::to_string(g));
    for (int t = 0; t < 64; ++t) pg->add_prompt_tokens((g * 31 + t) % vocab);
    for (int r = 0; r < responses; ++r) {
      v1::Response* resp = pg->add_responses();
      for (int t = 0; t < tokens; ++t) resp->add_tokens((g * 7 + r * 13 + t) % vocab);
      resp->set_reward(static_cast<float>(r % 2));
    }
  }
  return b;
}

struct Result {
  double seconds;
  int64_t responses, bytes;
};

Result Stream(int port, int clients, int batches, const v1::RolloutBatch& batch) {
  std::vector<std::thread> threads;
  std::atomic<int64_t> ok{0};
  const auto t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      auto stub = v1::Learner::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                           grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      v1::SubmitResponse r;
      auto writer = stub->SubmitStream(&ctx, &r);
      for (int i = 0; i < batches; ++i) writer->Write(batch);
      writer->WritesDone();
      if (writer->Finish().ok()) ok += static_cast<int64_t>(r.accepted_batches());
    });
  }
  for (auto& t : threads) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t per_batch_responses = 0;
  for (const auto& g : batch.groups()) per_batch_responses += g.responses_size();
  return {s, ok.load() * per_batch_responses,
          ok.load() * static_cast<int64_t>(batch.ByteSizeLong())};
}

int64_t RssBytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, rss = 0;
  f >> size >> rss;
  return rss * sysconf(_SC_PAGESIZE);
}

}  // namespace

int main(int argc, char** argv) {
  const int clients = static_cast<int>(Flag(argc, argv, "--clients", 4));
  const int batches = static_cast<int>(Flag(argc, argv, "--batches", 400));
  const int groups = static_cast<int>(Flag(argc, argv, "--groups", 16));
  const int responses = static_cast<int>(Flag(argc, argv, "--responses", 8));
  const int tokens = static_cast<int>(Flag(argc, argv, "--tokens", 256));
  const int64_t capacity = Flag(argc, argv, "--queue", 256);
  const int vocab = 151936;
  const v1::RolloutBatch batch = MakeBatch(groups, responses, tokens, vocab);

  GroupQueue queue({capacity, 64});
  LearnerCounters counters;
  asympo::learner::LearnerServiceOptions so;
  so.limits.vocab_size = vocab;
  so.limits.max_groups_per_batch = groups;
  so.limits.max_group_size = responses;
  // With the daemon's metrics observer, as asympo-learner runs it.
  auto registry = std::make_shared<prometheus::Registry>();
  asympo::learner::LearnerMetrics metrics(*registry, {});
  LearnerService service(so, &queue, &counters, &metrics);
  BareSink bare;
  int learner_port = 0, bare_port = 0;
  grpc::ServerBuilder lb, bb;
  lb.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &learner_port);
  lb.RegisterService(&service);
  lb.SetMaxReceiveMessageSize(64 << 20);
  bb.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &bare_port);
  bb.RegisterService(&bare);
  bb.SetMaxReceiveMessageSize(64 << 20);
  auto learner_server = lb.BuildAndStart();
  auto bare_server = bb.BuildAndStart();

  // The trainer's side: drain the queue as fast as groups arrive.
  std::atomic<bool> stop{false};
  std::thread drain([&] {
    while (!stop) queue.Pop(groups, absl::Now() + absl::Milliseconds(20));
  });
  std::printf(
      "# ingest_bench: %d clients x %d batches of %d groups x %d responses x %d tokens "
      "(%zu bytes per batch)\n\n",
      clients, batches, groups, responses, tokens, batch.ByteSizeLong());
  std::printf("| sink | responses/s | MB/s | ratio |\n| --- | ---: | ---: | ---: |\n");
  std::vector<Result> bare_runs, learner_runs;
  for (int round = 0; round < 3; ++round) {
    bare_runs.push_back(Stream(bare_port, clients, batches, batch));
    learner_runs.push_back(Stream(learner_port, clients, batches, batch));
  }
  auto median = [](std::vector<Result> v) {
    std::sort(v.begin(), v.end(),
              [](const Result& a, const Result& b) { return a.seconds < b.seconds; });
    return v[v.size() / 2];
  };
  const Result b = median(bare_runs), l = median(learner_runs);
  const double bare_bps = b.bytes / b.seconds, learner_bps = l.bytes / l.seconds;
  std::printf("| bare gRPC stream (reads, discards) | %.0f | %.1f | 1.00 |\n",
              b.responses / b.seconds, bare_bps / 1e6);
  std::printf("| Learner: validate + queue (+ drain) | %.0f | %.1f | %.2f |\n",
              l.responses / l.seconds, learner_bps / 1e6, learner_bps / bare_bps);
  stop = true;
  drain.join();

  // Memory with a full queue: fill K groups and compare with the bound.
  const int64_t before = RssBytes();
  while (queue.Stats().depth_groups + groups <= capacity) {
    std::vector<asympo::learner::QueuedGroup> gs;
    v1::RolloutBatch copy = batch;
    if (!service.Prepare(&copy, &gs).ok()) return 1;
    if (!queue.Push(std::move(gs), absl::Now()).ok()) break;
  }
  const int64_t after = RssBytes();
  // Bound (docs/protocol.md): K groups x (prompt + G x response tokens) x 4
  // bytes for the ids, plus at most 128 bytes of message and allocator
  // overhead per response and 512 per group.
  const int64_t per_group = (64 + responses * tokens) * 4 + responses * 128 + 512;
  std::printf(
      "\nfull queue: %lld groups, resident memory +%.3f MB; bound %.3f MB "
      "(%lld bytes per group x K)\n",
      static_cast<long long>(queue.Stats().depth_groups), (after - before) / 1e6,
      static_cast<double>(per_group * capacity) / 1e6, static_cast<long long>(per_group));
  learner_server->Shutdown();
  bare_server->Shutdown();
  return 0;
}

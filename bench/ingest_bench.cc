// Learner ingest throughput: 4 clients stream rollout batches over loopback
// to (a) the Learner service, which validates and queues every batch while a
// consumer drains the queue, and (b) a bare service on the same proto that
// reads the same messages and does nothing with them. Same run, same bytes.
// Then the learner's memory with a full queue, against the documented bound.
//
//   ingest_bench [--clients 4] [--batches 400] [--groups 16] [--responses 8]
//                [--tokens 256] [--queue 256]
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "bench/bench_flags.h"
#include "common/daemon/heap_release.h"
#include "learner_server/admission/group_queue.h"
#include "learner_server/admission/learner_service.h"
#include "learner_server/learner_metrics.h"

namespace {

using asympo::bench::Flag;
using asympo::learner::GroupQueue;
using asympo::learner::LearnerCounters;
using asympo::learner::LearnerService;
namespace v1 = asympo::v1;

// Qwen3's embedding rows: token ids as wide as the learner's real ones.
constexpr int kVocab = 151936;

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

// With a non-empty `ids`, every batch carries its own batch_id
// ("<ids>/<client>/<i>"), as the project's clients send them.
Result Stream(int port, int clients, int batches, const v1::RolloutBatch& batch,
              const std::string& ids = "") {
  std::vector<std::thread> threads;
  std::atomic<int64_t> ok{0};
  const auto t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto stub = v1::Learner::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                           grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      v1::SubmitResponse r;
      v1::RolloutBatch mine = batch;
      const std::string prefix = ids + "/" + std::to_string(c) + "/";
      auto writer = stub->SubmitStream(&ctx, &r);
      for (int i = 0; i < batches; ++i) {
        if (!ids.empty()) mine.set_batch_id(prefix + std::to_string(i));
        writer->Write(mine);
      }
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

// The command line; defaults as in the usage at the top of this file.
struct Args {
  int clients;
  int batches;
  int groups;
  int responses;
  int tokens;
  int64_t capacity;  // --queue: the learner's queue bound, in groups
};

Args ParseArgs(int argc, char** argv) {
  Args args;
  args.clients = static_cast<int>(Flag(argc, argv, "--clients", 4));
  args.batches = static_cast<int>(Flag(argc, argv, "--batches", 400));
  args.groups = static_cast<int>(Flag(argc, argv, "--groups", 16));
  args.responses = static_cast<int>(Flag(argc, argv, "--responses", 8));
  args.tokens = static_cast<int>(Flag(argc, argv, "--tokens", 256));
  args.capacity = Flag(argc, argv, "--queue", 256);
  asympo::bench::RejectUnknownFlags(argc, argv);
  return args;
}

// Limits that admit the bench's batches and nothing bigger.
asympo::learner::LearnerServiceOptions ServiceOptions(const Args& args) {
  asympo::learner::LearnerServiceOptions so;
  so.limits.vocab_size = kVocab;
  so.limits.max_groups_per_batch = args.groups;
  so.limits.max_group_size = args.responses;
  return so;
}

// Serves `service` on a free loopback port, which it writes to `port`.
std::unique_ptr<grpc::Server> StartServer(grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(64 << 20);
  return builder.BuildAndStart();
}

// The run of median duration.
Result MedianRun(std::vector<Result> runs) {
  std::sort(runs.begin(), runs.end(),
            [](const Result& a, const Result& b) { return a.seconds < b.seconds; });
  return runs[runs.size() / 2];
}

// Three rounds that alternate the sinks, so that both see the same machine
// state, then the table of medians.
void CompareSinks(const Args& args, const v1::RolloutBatch& batch, int bare_port,
                  int learner_port) {
  std::printf("| sink | responses/s | MB/s | ratio |\n| --- | ---: | ---: | ---: |\n");
  std::vector<Result> bare_runs, learner_runs, id_runs;
  for (int round = 0; round < 3; ++round) {
    bare_runs.push_back(Stream(bare_port, args.clients, args.batches, batch));
    learner_runs.push_back(Stream(learner_port, args.clients, args.batches, batch));
    id_runs.push_back(
        Stream(learner_port, args.clients, args.batches, batch, "round" + std::to_string(round)));
  }
  const Result b = MedianRun(bare_runs), l = MedianRun(learner_runs), d = MedianRun(id_runs);
  const double bare_bps = b.bytes / b.seconds, learner_bps = l.bytes / l.seconds;
  const double id_bps = d.bytes / d.seconds;
  std::printf("| bare gRPC stream (reads, discards) | %.0f | %.1f | 1.00 |\n",
              b.responses / b.seconds, bare_bps / 1e6);
  std::printf("| Learner: validate + queue (+ drain) | %.0f | %.1f | %.2f |\n",
              l.responses / l.seconds, learner_bps / 1e6, learner_bps / bare_bps);
  std::printf("| Learner, every batch with a batch_id (exactly-once) | %.0f | %.1f | %.2f |\n",
              d.responses / d.seconds, id_bps / 1e6, id_bps / bare_bps);
}

// Memory with a full queue: fills the queue through the service's own
// validation, K groups, and compares the growth with the documented bound.
// False if the service rejects the batch.
bool MeasureFullQueue(const Args& args, const v1::RolloutBatch& batch, LearnerService* service,
                      GroupQueue* queue) {
  const int64_t before = asympo::daemon::ResidentBytes();
  while (queue->Stats().depth_groups + args.groups <= args.capacity) {
    std::vector<asympo::learner::QueuedGroup> gs;
    v1::RolloutBatch copy = batch;
    if (!service->Prepare(&copy, &gs).accepted()) return false;
    if (!queue->Push(std::move(gs), absl::Now()).accepted()) break;
  }
  const int64_t after = asympo::daemon::ResidentBytes();
  // Bound (docs/protocol.md): K groups x (prompt + G x response tokens) x 4
  // bytes for the ids, plus at most 128 bytes of message and allocator
  // overhead per response and 512 per group.
  const int64_t per_group = (64 + args.responses * args.tokens) * 4 + args.responses * 128 + 512;
  std::printf(
      "\nfull queue: %lld groups, resident memory +%.3f MB; bound %.3f MB "
      "(%lld bytes per group x K)\n",
      static_cast<long long>(queue->Stats().depth_groups), (after - before) / 1e6,
      static_cast<double>(per_group * args.capacity) / 1e6, static_cast<long long>(per_group));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  const v1::RolloutBatch batch = MakeBatch(args.groups, args.responses, args.tokens, kVocab);

  GroupQueue queue({args.capacity, 64});
  LearnerCounters counters;
  // With the daemon's metrics observer, as asympo-learner runs it.
  auto registry = std::make_shared<prometheus::Registry>();
  asympo::learner::LearnerMetrics metrics(*registry, {});
  LearnerService service(ServiceOptions(args), &queue, &counters, &metrics);
  BareSink bare;
  int learner_port = 0, bare_port = 0;
  auto learner_server = StartServer(&service, &learner_port);
  auto bare_server = StartServer(&bare, &bare_port);

  // The trainer's side: drain the queue as fast as groups arrive.
  std::atomic<bool> stop{false};
  std::thread drain([&] {
    while (!stop) queue.Pop(args.groups, absl::Now() + absl::Milliseconds(20));
  });
  std::printf(
      "# ingest_bench: %d clients x %d batches of %d groups x %d responses x %d tokens "
      "(%zu bytes per batch)\n\n",
      args.clients, args.batches, args.groups, args.responses, args.tokens, batch.ByteSizeLong());
  CompareSinks(args, batch, bare_port, learner_port);
  stop = true;
  drain.join();

  if (!MeasureFullQueue(args, batch, &service, &queue)) return 1;
  learner_server->Shutdown();
  bare_server->Shutdown();
  return 0;
}

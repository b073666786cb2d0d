// Weight broadcast transfer over gRPC against a bare TCP copy of as many
// bytes, side by side in one process on loopback.
//
// For each snapshot size (float32 parameters) and receiver count: the
// BroadcastSender publishes a new version and WeightReceivers (one channel
// each) fetch it into fresh buffers and check every bucket's CRC-32C; then a
// plain socket server writes the same buckets to as many client sockets,
// which read them into a buffer. Rounds alternate gRPC / TCP; each cell is a
// median over the rounds. Bytes/s counts the bytes delivered to all
// receivers; the ratio column is the median over rounds of each round's
// TCP time / gRPC time. (TCP sends the tensors' bytes unpacked: with
// 64-byte-aligned tensors of 4M parameters the packed snapshot has the same
// size.)
//
//   broadcast_bench [--params_m 100,500] [--receivers 1,2] [--reps 3]
//                   [--bucket_mib 256] [--chunk_kib 0] [--tensor_m 4]
//                   [--malloc_tuned 0] [--tcp 1]
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

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
#include <prometheus/registry.h>

#include "bench/bench_flags.h"
#include "common/crc32c.h"
#include "common/daemon/daemon_runtime.h"
#include "weight_broadcaster/broadcast_receiver.h"
#include "weight_broadcaster/broadcast_sender.h"

namespace {

namespace bc = asympo::broadcast;
namespace v1 = asympo::v1;
using Clock = std::chrono::steady_clock;
using asympo::bench::Flag;
using asympo::bench::ListFlag;
using asympo::bench::Median;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A model of `params` float32 parameters in tensors of `per_tensor`.
struct Model {
  std::vector<bc::TensorSpec> specs;
  std::vector<std::vector<float>> data;

  Model(int64_t params, int64_t per_tensor) {
    uint64_t x = 0x243F6A8885A308D3ull;
    for (int64_t done = 0, i = 0; done < params; ++i) {
      const int64_t n = std::min(per_tensor, params - done);
      specs.push_back({"model.layers." + std::to_string(i) + ".weight", v1::DTYPE_F32, {n}});
      std::vector<float> t(static_cast<size_t>(n));
      for (float& f : t) {  // xorshift: incompressible, cheap
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        f = static_cast<float>(x >> 40) * 1e-7f;
      }
      data.push_back(std::move(t));
      done += n;
    }
  }
  std::vector<bc::TensorView> Views() const {
    std::vector<bc::TensorView> v;
    for (size_t i = 0; i < specs.size(); ++i) {
      v.push_back({specs[i], data[i].data(), data[i].size() * sizeof(float)});
    }
    return v;
  }
  // Changes one value so that each published version differs.
  void Touch(uint64_t version) { data[0][0] = static_cast<float>(version); }
};

// --- bare TCP: one thread per client writes every bucket to its socket. ---

struct TcpServer {
  int fd = -1;
  int port = 0;
  TcpServer() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, 16) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      std::perror("tcp server");
      std::exit(1);
    }
    port = ntohs(a.sin_port);
  }
  ~TcpServer() { ::close(fd); }
};

struct Span {
  const char* data;
  size_t size;
};

// Sends `spans` (the model's bytes) to `clients` sockets at once; each client
// reads the stream into its bucket-sized sink, wrapping around. Returns the
// seconds from the first connect to the last byte read.
double TcpTransfer(const TcpServer& server, const std::vector<Span>& spans, int clients,
                   std::vector<std::string>* sinks) {
  size_t total = 0;
  for (const Span& s : spans) total += s.size;
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      const int s = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(server.port));
      if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) std::exit(2);
      std::string& sink = (*sinks)[static_cast<size_t>(c)];
      size_t at = 0;
      for (size_t got = 0; got < total;) {
        if (at == sink.size()) at = 0;
        const ssize_t n = ::read(s, sink.data() + at, std::min(sink.size() - at, total - got));
        if (n <= 0) std::exit(3);
        got += static_cast<size_t>(n);
        at += static_cast<size_t>(n);
      }
      ::close(s);
    });
  }
  for (int c = 0; c < clients; ++c) {
    const int conn = ::accept(server.fd, nullptr, nullptr);
    threads.emplace_back([&, conn] {
      for (const Span& b : spans) {
        size_t sent = 0;
        while (sent < b.size) {
          const ssize_t n = ::write(conn, b.data + sent, b.size - sent);
          if (n <= 0) std::exit(4);
          sent += static_cast<size_t>(n);
        }
      }
      ::close(conn);
    });
  }
  for (auto& t : threads) t.join();
  return Seconds(t0);
}

// The command line; defaults as in the usage at the top of this file.
struct Args {
  std::vector<int64_t> sizes_m;
  std::vector<int64_t> receiver_counts;
  int reps;
  int64_t bucket_mib;
  int64_t chunk_kib;
  int64_t tensor_m;
  bool tcp_baseline;  // false: gRPC only (profiling)
  // Keep freed heap memory instead of returning it to the kernel at once
  // (what a rollout daemon can set with mallopt or GLIBC_TUNABLES): gRPC's
  // receive buffers then stop costing page faults.
  bool malloc_tuned;
};

Args ParseArgs(int argc, char** argv) {
  Args args;
  args.sizes_m = ListFlag(argc, argv, "--params_m", "100,500");
  args.receiver_counts = ListFlag(argc, argv, "--receivers", "1,2");
  args.reps = static_cast<int>(Flag(argc, argv, "--reps", 3));
  args.bucket_mib = Flag(argc, argv, "--bucket_mib", 256);
  args.chunk_kib = Flag(argc, argv, "--chunk_kib", 0);
  args.tensor_m = Flag(argc, argv, "--tensor_m", 4);
  args.tcp_baseline = Flag(argc, argv, "--tcp", 1) != 0;
  args.malloc_tuned = Flag(argc, argv, "--malloc_tuned", 0) != 0;
  asympo::bench::RejectUnknownFlags(argc, argv);
  return args;
}

// What the receiver's checksum costs on its own (one thread, one pass), in
// bytes per second. The checksums go to `sink` so that they stay computed.
double CrcBytesPerSecond(uint32_t* sink) {
  std::string block(256u << 20, '\x5a');
  std::vector<double> crc_s;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    *sink ^= asympo::Crc32c(block.data(), block.size());
    crc_s.push_back(Seconds(t0));
  }
  return block.size() / Median(crc_s);
}

// The settings and the CRC-32C rate, then the table's header.
void PrintHeader(const Args& args, double crc_bps, uint32_t crc_sink) {
  std::printf(
      "# broadcast_bench: float32 snapshots, %lld MiB buckets, chunk %s, %d rounds, "
      "malloc %s; CRC-32C alone %.0f MB/s on one thread (%s)%s\n\n",
      static_cast<long long>(args.bucket_mib),
      args.chunk_kib == 0 ? "default (4 MiB)" : (std::to_string(args.chunk_kib) + " KiB").c_str(),
      args.reps, args.malloc_tuned ? "tuned" : "default", crc_bps / 1e6,
      asympo::Crc32cIsHardwareAccelerated() ? "SSE4.2" : "table", crc_sink == 1 ? " " : "");
  std::printf(
      "| snapshot | receivers | gRPC MB/s | TCP MB/s | gRPC / TCP | CRC share of a receiver's "
      "time | publish s |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
}

bc::SnapshotStoreOptions StoreOptions(const Args& args) {
  bc::SnapshotStoreOptions so;
  so.packing.bucket_bytes = static_cast<uint64_t>(args.bucket_mib) << 20;
  return so;
}

// The gRPC side of one snapshot size: the model, the store it is published
// to, the sender that serves it and the server that the receivers fetch
// from. Members are destroyed in reverse order: the server before the
// sender it serves, the sender before the store it reads.
struct Publisher {
  Model model;
  std::string signature;
  prometheus::Registry registry;  // not exported
  bc::SnapshotStore store;
  bc::BroadcastSender sender;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  uint64_t version = 0;  // the last one published

  Publisher(const Args& args, int64_t params_m)
      : model(params_m * 1000000, args.tensor_m * 1000000),
        signature(bc::ModelSignature(model.specs)),
        store(StoreOptions(args), signature, registry),
        sender({}, store, registry) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&sender);
    server = builder.BuildAndStart();
  }

  void Shutdown() {
    sender.Shutdown();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
};

using Receivers = std::vector<std::unique_ptr<bc::WeightReceiver>>;
using Snapshots = std::vector<std::shared_ptr<const bc::ReceivedSnapshot>>;

// Starts `n` receivers, one channel each. New receivers first fetch the
// version already published (untimed). False if one fetches anything else.
// Their metrics go to `registry`.
bool StartReceivers(const Args& args, const Publisher& publisher, int64_t n,
                    prometheus::Registry& registry, Receivers* receivers) {
  for (int64_t i = 0; i < n; ++i) {
    bc::WeightReceiverOptions ro;
    ro.target = "127.0.0.1:" + std::to_string(publisher.port);
    ro.receiver_id = "bench-" + std::to_string(i);
    ro.model_signature = publisher.signature;
    ro.max_chunk_bytes = static_cast<uint32_t>(args.chunk_kib << 10);
    receivers->push_back(*bc::WeightReceiver::Start(ro, registry));
  }
  const uint64_t version = publisher.version;
  for (auto& rx : *receivers) {
    while (!rx->connected()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (version > 0 &&
        (!rx->WaitForPending(absl::Minutes(5)) || rx->TakePending()->version() != version)) {
      return false;
    }
  }
  return true;
}

// Waits for every receiver's copy of the version just published.
bool TakeFromAll(Receivers* receivers, Snapshots* got) {
  for (auto& rx : *receivers) {
    if (!rx->WaitForPending(absl::Minutes(5))) {
      std::fprintf(stderr, "receiver got nothing (failures %lld)\n",
                   static_cast<long long>(rx->failures()));
      return false;
    }
    got->push_back(rx->TakePending());
  }
  return true;
}

// Every receiver got `version`; with `compare_bytes`, every byte as sent.
bool CheckSnapshots(const Snapshots& got, uint64_t version, const std::vector<Span>& spans,
                    bool compare_bytes) {
  for (const auto& g : got) {
    if (g->version() != version) return false;
    for (int t = 0; compare_bytes && t < g->manifest.tensors_size(); ++t) {
      const std::string_view b = g->TensorBytes(g->manifest.tensors(t));
      if (b.size() != spans[static_cast<size_t>(t)].size ||
          std::memcmp(b.data(), spans[static_cast<size_t>(t)].data, b.size()) != 0) {
        std::fprintf(stderr, "tensor %d differs\n", t);
        return false;
      }
    }
  }
  return true;
}

// Each round's seconds for one table cell, and the snapshot's bytes.
struct CellTimes {
  std::vector<double> grpc_s, tcp_s, ratios, publish_s;
  uint64_t total = 0;
};

// --reps rounds, each a gRPC publish and fetch by all receivers, then the
// same bytes over TCP to as many clients.
bool RunRounds(const Args& args, Publisher* publisher, Receivers* receivers, CellTimes* times) {
  const int64_t n = static_cast<int64_t>(receivers->size());
  Model& model = publisher->model;
  TcpServer tcp;
  std::vector<Span> spans;  // TCP sends the tensors' bytes as they are
  for (const auto& t : model.data) {
    spans.push_back({reinterpret_cast<const char*>(t.data()), t.size() * sizeof(float)});
  }
  std::vector<std::string> sinks(static_cast<size_t>(n),
                                 std::string(static_cast<size_t>(args.bucket_mib) << 20, '\0'));
  // Round 0 is a warm-up, left out of the medians: the sender and the
  // receivers then work in buffers of earlier versions, as they do in a
  // running system (first touches of fresh memory are very slow on VMs).
  for (int r = -1; r < args.reps; ++r) {
    const uint64_t version = ++publisher->version;
    model.Touch(version);
    const auto p0 = Clock::now();
    if (!publisher->store.Publish(version, model.Views()).ok()) return false;
    times->publish_s.push_back(Seconds(p0));
    const auto t0 = Clock::now();
    Snapshots got;
    if (!TakeFromAll(receivers, &got)) return false;
    times->grpc_s.push_back(Seconds(t0));
    times->total = got[0]->manifest.total_bytes();
    // Untimed: every byte arrived as sent.
    if (!CheckSnapshots(got, version, spans, /*compare_bytes=*/r <= 0)) return false;
    got.clear();
    times->tcp_s.push_back(args.tcp_baseline ? TcpTransfer(tcp, spans, static_cast<int>(n), &sinks)
                                             : 1e9);
    times->ratios.push_back(times->tcp_s.back() / times->grpc_s.back());
    if (r < 0) {
      times->grpc_s.clear();
      times->tcp_s.clear();
      times->ratios.clear();
      times->publish_s.clear();
    }
  }
  return true;
}

// One table row: medians over the rounds.
void PrintRow(int64_t params_m, int64_t n, const CellTimes& times, double crc_bps) {
  const double total = static_cast<double>(times.total);
  const double grpc_bps = total * n / Median(times.grpc_s);
  const double tcp_bps = total * n / Median(times.tcp_s);
  const double crc_share = (total / crc_bps) / Median(times.grpc_s);
  std::printf("| %lldM params (%.0f MB) | %lld | %.0f | %.0f | %.2f | %.0f%% | %.3f |\n",
              static_cast<long long>(params_m), times.total / 1e6, static_cast<long long>(n),
              grpc_bps / 1e6, tcp_bps / 1e6, Median(times.ratios), 100 * crc_share,
              Median(times.publish_s));
  std::fflush(stdout);
}

// The rows of one snapshot size, one per receiver count, all served by one
// sender.
bool BenchSnapshotSize(const Args& args, int64_t params_m, double crc_bps) {
  Publisher publisher(args, params_m);
  for (const int64_t n : args.receiver_counts) {
    prometheus::Registry registry;  // outlives the receivers; not exported
    Receivers receivers;
    if (!StartReceivers(args, publisher, n, registry, &receivers)) return false;
    CellTimes times;
    if (!RunRounds(args, &publisher, &receivers, &times)) return false;
    PrintRow(params_m, n, times, crc_bps);
  }
  publisher.Shutdown();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  if (args.malloc_tuned) asympo::daemon::RetainFreedMemory();
  uint32_t crc_sink = 0;
  const double crc_bps = CrcBytesPerSecond(&crc_sink);
  PrintHeader(args, crc_bps, crc_sink);
  for (const int64_t m : args.sizes_m) {
    if (!BenchSnapshotSize(args, m, crc_bps)) return 1;
  }
  return 0;
}

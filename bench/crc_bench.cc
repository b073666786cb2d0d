// CRC-32C against memcpy, side by side in one run, on this machine: the
// table-driven path, the hardware instruction in one stream, in three
// interleaved streams (Crc32c), and over threads (Crc32cOfMany, the
// snapshot store's path), and a version packed and checksummed as the
// store does it (one copy into the buckets, then their CRCs), each as GB/s
// and as a ratio to one thread's memcpy. Medians of --reps runs after a
// warm-up.
//
//   crc_bench [--mib 1024] [--bucket_mib 256] [--threads 0] [--reps 5]
//
// --threads 0: every core (std::thread::hardware_concurrency).
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_flags.h"
#include "common/crc32c.h"

namespace {

using asympo::bench::Flag;
using asympo::bench::WarmMedianSeconds;

struct Row {
  std::string name;
  double seconds;
};

std::vector<asympo::Crc32cSpan> Buckets(const std::vector<uint8_t>& buf, size_t bucket) {
  std::vector<asympo::Crc32cSpan> spans;
  for (size_t off = 0; off < buf.size(); off += bucket) {
    spans.push_back({buf.data() + off, std::min(bucket, buf.size() - off)});
  }
  return spans;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mib = Flag(argc, argv, "--mib", 1024);
  const int64_t bucket_mib = Flag(argc, argv, "--bucket_mib", 256);
  int64_t threads = Flag(argc, argv, "--threads", 0);
  const int64_t reps = Flag(argc, argv, "--reps", 5);
  asympo::bench::RejectUnknownFlags(argc, argv);
  if (mib < 1 || bucket_mib < 1 || reps < 1 || threads < 0) {
    std::fprintf(stderr, "--mib, --bucket_mib and --reps must be positive, --threads >= 0\n");
    return 2;
  }
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  const size_t bytes = static_cast<size_t>(mib) << 20;
  std::vector<uint8_t> src(bytes), dst(bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t w = rng();
    std::memcpy(src.data() + i, &w, 8);
  }
  std::memset(dst.data(), 0, bytes);  // faulted in before any timing
  const std::vector<asympo::Crc32cSpan> buckets =
      Buckets(src, static_cast<size_t>(bucket_mib) << 20);
  volatile uint32_t sink = 0;
  const auto time = [&](const std::function<void()>& fn) { return WarmMedianSeconds(fn, reps); };
  std::vector<Row> rows;
  rows.push_back({"memcpy, one thread", time([&] { std::memcpy(dst.data(), src.data(), bytes); })});
  rows.push_back({"CRC-32C, table (slicing-by-8)",
                  time([&] { sink = asympo::Crc32cPortable(src.data(), bytes); })});
  if (asympo::Crc32cIsHardwareAccelerated()) {
    rows.push_back({"CRC-32C, crc32 instruction, one stream",
                    time([&] { sink = asympo::Crc32cOneStream(src.data(), bytes); })});
  }
  rows.push_back({"CRC-32C, three interleaved streams (Crc32c)",
                  time([&] { sink = asympo::Crc32c(src.data(), bytes); })});
  const std::string threaded = "CRC-32C, " + std::to_string(threads) + " threads (Crc32cOfMany)";
  rows.push_back({threaded, time([&] {
                    sink = asympo::Crc32cOfMany(buckets, static_cast<int>(threads))[0];
                  })});
  rows.push_back({"pack + CRC: memcpy into the buckets, then Crc32cOfMany", time([&] {
                    std::memcpy(dst.data(), src.data(), bytes);
                    sink = asympo::Crc32cOfMany(Buckets(dst, static_cast<size_t>(bucket_mib) << 20),
                                                static_cast<int>(threads))[0];
                  })});
  (void)sink;
  std::printf("%lld MiB in buckets of %lld MiB, %lld threads, median of %lld\n\n",
              static_cast<long long>(mib), static_cast<long long>(bucket_mib),
              static_cast<long long>(threads), static_cast<long long>(reps));
  std::printf("| path | GB/s | against memcpy |\n| --- | --- | --- |\n");
  for (const Row& r : rows) {
    std::printf("| %s | %.2f | %.2fx |\n", r.name.c_str(),
                static_cast<double>(bytes) / r.seconds / 1e9, rows[0].seconds / r.seconds);
  }
  return 0;
}

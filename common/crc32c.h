// CRC-32C (Castagnoli): the checksum of every snapshot bucket and checkpoint file.
// Uses the SSE4.2 crc32 instruction when the CPU has it (three interleaved
// streams over 8 KiB blocks, joined by shifting: the instruction's latency is
// three cycles), a table otherwise; both give identical results.
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace asympo {

// Extends `crc` (the value returned for the preceding bytes, 0 to start) over
// `n` bytes at `data`. Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

// The table-driven path alone, whatever the CPU (for tests and benchmarks).
uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc = 0);

// Whether Crc32c uses the hardware instruction on this machine.
bool Crc32cIsHardwareAccelerated();

// The hardware instruction in one stream (bench/crc_bench: what the
// interleaving gains); the table where the CPU lacks it.
uint32_t Crc32cOneStream(const void* data, size_t n, uint32_t crc = 0);

// The CRC-32C of A followed by B, from crc(A), crc(B) and B's length.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// The CRC-32C of each span, computed by up to `threads` threads over pieces
// of at most 32 MiB (a large span is split and its pieces combined), in the
// spans' order.
struct Crc32cSpan {
  const void* data;
  size_t size;
};
std::vector<uint32_t> Crc32cOfMany(const std::vector<Crc32cSpan>& spans, int threads);

}  // namespace asympo

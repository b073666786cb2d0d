// CRC-32C (Castagnoli): the checksum of every snapshot bucket and checkpoint file.
// Uses the SSE4.2 crc32 instruction when the CPU has it, a table otherwise;
// both give identical results. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace asympo {

// Extends `crc` (the value returned for the preceding bytes, 0 to start) over
// `n` bytes at `data`. Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

// The table-driven path alone, whatever the CPU (for tests and benchmarks).
uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc = 0);

// Whether Crc32c uses the hardware instruction on this machine.
bool Crc32cIsHardwareAccelerated();

}  // namespace asympo

// The bytes LibTorch holds on the CPU, and their peak: an allocator that
// wraps the default CPU allocator and counts what it hands out and gets
// back. Install it before the tensors to be counted are allocated (tensors
// allocated earlier are neither counted nor subtracted); it stays installed
// for the life of the process. For benchmarks and tests that measure peak
// memory on CPU, where LibTorch keeps no statistics. Thread-safe.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

namespace asympo {

class CpuMemory final : public c10::Allocator {
 public:
  // Installs the tracker as LibTorch's CPU allocator (once per process).
  static CpuMemory& Install() {
    static CpuMemory* tracker = [] {
      auto* t = new CpuMemory(c10::GetCPUAllocator());
      c10::SetCPUAllocator(t, /*priority=*/100);
      return t;
    }();
    return *tracker;
  }

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  // From now on the peak is measured from the current amount.
  void ResetPeak() { peak_.store(current_.load()); }

  // LibTorch 2.3 made Allocator::allocate non-const and added copy_data.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return Track(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return Track(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
  // What one allocation came from, to give back and to count.
  struct Block {
    c10::DataPtr base;
    size_t bytes;
    CpuMemory* owner;
  };

  explicit CpuMemory(c10::Allocator* base) : base_(base) {}

  c10::DataPtr Track(size_t n) const {
    auto* self = const_cast<CpuMemory*>(this);
    auto* block = new Block{base_->allocate(n), n, self};
    const int64_t now = self->current_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t seen = self->peak_.load();
    while (now > seen && !self->peak_.compare_exchange_weak(seen, now)) {
    }
    return {block->base.get(), block, &Free, c10::Device(c10::DeviceType::CPU)};
  }

  static void Free(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    block->owner->current_.fetch_sub(static_cast<int64_t>(block->bytes));
    delete block;  // its DataPtr frees the memory
  }

  c10::Allocator* base_;
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace asympo

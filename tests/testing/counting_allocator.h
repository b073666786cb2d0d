// Test helper: a CPU allocator that counts the bytes of live tensors and
// their peak, installed in place of LibTorch's for a measured stretch:
//
//   CountingAllocator::Installed counting;  // every CPU tensor of the process
//   counting->Reset();
//   ... the code measured ...
//   EXPECT_LE(counting->PeakAbove(), bound);
//
// Measures tensor memory (what a path allocates), not the process's resident
// size; a tensor allocated before the install and freed during it is not
// counted either way.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <c10/core/CPUAllocator.h>

namespace asympo::testing {

class CountingAllocator : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) const override {
    auto* ctx = new Context{base_->allocate(n), n, this};
    const int64_t live = live_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    return {ctx->inner.get(), ctx, &Delete, ctx->inner.device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  // The peak since the last reset, above the bytes live at the reset.
  void Reset() { peak_ = live_.load(), base_live_ = live_.load(); }
  int64_t PeakAbove() const { return peak_.load() - base_live_; }

  // Installs a counting allocator over the current CPU allocator for its
  // lifetime. The allocator itself lives until the process ends (tensors it
  // allocated may outlive the scope and call back into it when freed), kept
  // in a registry that is never destroyed, so it stays reachable and a leak
  // checker does not report it.
  class Installed {
   public:
    Installed()
        : original_(c10::GetCPUAllocator()), counting_(Keep(new CountingAllocator(original_))) {
      c10::SetCPUAllocator(counting_, /*priority=*/100);
    }
    ~Installed() { c10::SetCPUAllocator(original_, /*priority=*/100); }
    Installed(const Installed&) = delete;
    Installed& operator=(const Installed&) = delete;
    CountingAllocator* operator->() const { return counting_; }

   private:
    static CountingAllocator* Keep(CountingAllocator* a) {
      static auto* const kept = new std::vector<std::unique_ptr<CountingAllocator>>();
      static std::mutex mu;
      std::lock_guard<std::mutex> lock(mu);
      kept->emplace_back(a);
      return a;
    }
    c10::Allocator* original_;
    CountingAllocator* counting_;  // owned by Keep's registry
  };

 private:
  struct Context {
    c10::DataPtr inner;
    size_t n;
    const CountingAllocator* owner;
  };
  static void Delete(void* p) {
    auto* ctx = static_cast<Context*>(p);
    ctx->owner->live_.fetch_sub(static_cast<int64_t>(ctx->n));
    delete ctx;
  }
  c10::Allocator* base_;
  mutable std::atomic<int64_t> live_{0}, peak_{0};
  int64_t base_live_ = 0;
};

}  // namespace asympo::testing

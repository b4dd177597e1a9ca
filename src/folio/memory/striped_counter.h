// StripedCounter: a statistics counter that many threads update without sharing a cache line.
// Each thread adds to one of kStripes cache-line-sized cells (picked once per thread); a read
// sums the cells. Updates and reads are relaxed: a counter is a statistic that publishes no
// other data, so a sum read while other threads update may mix moments, and is exact when the
// updaters are quiescent (which is when the pool's invariant checks compare it).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace folio::memory {

class StripedCounter {
 public:
  static constexpr int kStripes = 16;

  void add(int64_t delta) {
    stripes_[stripe_of_this_thread()].value.fetch_add(delta, std::memory_order_relaxed);
  }
  int64_t sum() const {
    int64_t total = 0;
    for (const Stripe& stripe : stripes_) total += stripe.value.load(std::memory_order_relaxed);
    return total;
  }

 private:
  struct alignas(64) Stripe {
    std::atomic<int64_t> value{0};
  };
  static int stripe_of_this_thread() {
    static std::atomic<int> next_stripe{0};
    thread_local const int stripe = next_stripe.fetch_add(1, std::memory_order_relaxed) % kStripes;
    return stripe;
  }
  std::array<Stripe, kStripes> stripes_;
};

}  // namespace folio::memory

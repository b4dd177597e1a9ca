#include "folio/device/host_stream.h"

#include <algorithm>
#include <chrono>

#include "folio/base/check.h"

namespace folio::device {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void HostStream::run_unobserved(const HostKernel& kernel) {
  const HostKernel::Function function = kernel.function;
  const void* arguments = kernel.arguments;
  pool_->parallel_range(kernel.num_items, kernel.grain,
                        [&](int64_t begin, int64_t end, int thread_index) {
                          function(arguments, begin, end, thread_index);
                        });
}

void HostStream::run_observed(const HostKernel& kernel) {
  const HostKernel::Function function = kernel.function;
  const void* arguments = kernel.arguments;
  // Each thread index writes only its own entry, and parallel_range returns after every slice
  // finished (its completion count is an acquire), so the sum below sees every write.
  std::fill(busy_seconds_.begin(), busy_seconds_.end(), 0.0);
  const auto start = std::chrono::steady_clock::now();
  pool_->parallel_range(
      kernel.num_items, kernel.grain, [&](int64_t begin, int64_t end, int thread_index) {
        const auto slice_start = std::chrono::steady_clock::now();
        function(arguments, begin, end, thread_index);
        busy_seconds_[static_cast<size_t>(thread_index)] += seconds_since(slice_start);
      });
  KernelTiming timing;
  timing.wall_seconds = seconds_since(start);
  for (double busy : busy_seconds_) timing.busy_seconds += busy;
  timing.num_threads = pool_->num_threads();
  observer_->on_kernel(kernel, timing);
}

void HostStream::set_observer(HostKernelObserver* observer) {
  FOLIO_CHECK(!capturing_, "set_observer while capturing");
  observer_ = observer;
  busy_seconds_.assign(static_cast<size_t>(pool_->num_threads()), 0.0);
}

void HostStream::launch(HostKernel kernel) {
  FOLIO_DCHECK(kernel.function != nullptr, "launch of an empty kernel");
  kernel.tag = tag_;
  kernel.first_of_tag = !tag_opened_;
  tag_opened_ = true;
  if (capturing_) {
    captured_.push_back(kernel);
    return;
  }
  ++num_eager_launches_;
  run(kernel);
}

void HostStream::begin_capture() {
  FOLIO_CHECK(!capturing_, "begin_capture while already capturing");
  capturing_ = true;
  captured_.clear();
}

HostGraph HostStream::end_capture() {
  FOLIO_CHECK(capturing_, "end_capture without begin_capture");
  capturing_ = false;
  return HostGraph(std::move(captured_));
}

void HostStream::replay(const HostGraph& graph) {
  FOLIO_CHECK(!capturing_, "replay while capturing");
  for (const HostKernel& kernel : graph.kernels()) run(kernel);
  num_replayed_kernels_ += graph.num_kernels();
}

}  // namespace folio::device

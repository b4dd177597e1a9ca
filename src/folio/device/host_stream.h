// HostStream: where CPU kernels are launched. Eager by default: launch() runs the kernel on the
// stream's thread pool and returns when it is done. Between begin_capture() and end_capture()
// launches are recorded instead, into a HostGraph that can be replayed any number of times.
// This mirrors cudaStreamBeginCapture / cudaGraphLaunch so that the graph executor (exec/) is
// written once for both device kinds.
//
// An observer (host_kernel_observer.h), when set, is told the timing of every kernel run, eager
// or replayed; without one the only cost is a null check per kernel. Launch tags name the
// launcher of the kernels that follow (an IR op); they are recorded with the launch, so a
// replayed kernel carries its capture-time tag.
//
// Thread-safety: a stream is used by one thread at a time; different streams may share a pool.
#pragma once

#include <cstddef>
#include <vector>

#include "folio/base/thread_pool.h"
#include "folio/device/host_kernel.h"
#include "folio/device/host_kernel_observer.h"

namespace folio::device {

// A recorded list of kernel launches, replayed in order.
class HostGraph {
 public:
  HostGraph() = default;
  explicit HostGraph(std::vector<HostKernel> kernels) : kernels_(std::move(kernels)) {}

  const std::vector<HostKernel>& kernels() const { return kernels_; }
  size_t num_kernels() const { return kernels_.size(); }
  bool empty() const { return kernels_.empty(); }

 private:
  std::vector<HostKernel> kernels_;
};

class HostStream {
 public:
  explicit HostStream(ThreadPool& pool) : pool_(&pool) {}

  ThreadPool& pool() const { return *pool_; }

  // Runs `kernel` now, or records it while capturing, with the current launch tag.
  void launch(HostKernel kernel);

  // The launches that follow, up to the next call, are one unit of work tagged `tag` (the first
  // of them gets first_of_tag). -1: untagged.
  void set_launch_tag(int32_t tag) {
    tag_ = tag;
    tag_opened_ = false;
  }

  // Null: none. Not owned; must outlive its use here.
  void set_observer(HostKernelObserver* observer);
  HostKernelObserver* observer() const { return observer_; }

  // Requires: not capturing.
  void begin_capture();
  // Requires: capturing. Returns everything launched since begin_capture().
  HostGraph end_capture();
  bool is_capturing() const { return capturing_; }

  // Runs every kernel of `graph` in order; allocates nothing.
  void replay(const HostGraph& graph);

  // Counts launches run eagerly and kernels replayed, for tests and statistics.
  size_t num_eager_launches() const { return num_eager_launches_; }
  size_t num_replayed_kernels() const { return num_replayed_kernels_; }

 private:
  void run(const HostKernel& kernel) {
    if (observer_ != nullptr) {
      run_observed(kernel);
      return;
    }
    run_unobserved(kernel);
  }
  void run_unobserved(const HostKernel& kernel);
  void run_observed(const HostKernel& kernel);

  ThreadPool* pool_;
  HostKernelObserver* observer_ = nullptr;
  // Per thread index: seconds of the observed kernel's slices that thread ran.
  std::vector<double> busy_seconds_;
  int32_t tag_ = -1;
  bool tag_opened_ = false;
  bool capturing_ = false;
  std::vector<HostKernel> captured_;
  size_t num_eager_launches_ = 0;
  size_t num_replayed_kernels_ = 0;
};

}  // namespace folio::device

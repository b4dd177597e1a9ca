// HostStream: where CPU kernels are launched. Eager by default: launch() runs the kernel on the
// stream's thread pool and returns when it is done. Between begin_capture() and end_capture()
// launches are recorded instead, into a HostGraph that can be replayed any number of times.
// This mirrors cudaStreamBeginCapture / cudaGraphLaunch so that the graph executor (exec/) is
// written once for both device kinds.
//
// Thread-safety: a stream is used by one thread at a time; different streams may share a pool.
#pragma once

#include <cstddef>
#include <vector>

#include "folio/base/thread_pool.h"
#include "folio/device/host_kernel.h"

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

  // Runs `kernel` now, or records it while capturing.
  void launch(const HostKernel& kernel);

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
  void run(const HostKernel& kernel);

  ThreadPool* pool_;
  bool capturing_ = false;
  std::vector<HostKernel> captured_;
  size_t num_eager_launches_ = 0;
  size_t num_replayed_kernels_ = 0;
};

}  // namespace folio::device

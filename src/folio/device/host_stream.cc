#include "folio/device/host_stream.h"

#include "folio/base/check.h"

namespace folio::device {

void HostStream::run(const HostKernel& kernel) {
  const HostKernel::Function function = kernel.function;
  const void* arguments = kernel.arguments;
  pool_->parallel_range(kernel.num_items, kernel.grain,
                        [&](int64_t begin, int64_t end, int thread_index) {
                          function(arguments, begin, end, thread_index);
                        });
}

void HostStream::launch(const HostKernel& kernel) {
  FOLIO_DCHECK(kernel.function != nullptr, "launch of an empty kernel");
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

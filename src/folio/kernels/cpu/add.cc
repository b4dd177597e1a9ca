#include "folio/kernels/cpu/add.h"

#include <algorithm>

#include "folio/base/check.h"
#include "folio/kernels/cpu/vector_launch.h"
#include "folio/kernels/cpu/vector_ops.h"
#include "folio/kernels/cpu/work_partition.h"

namespace folio::kernels::cpu {
namespace {

void add_items(const AddArguments& arguments, const VectorOps& ops, int64_t begin, int64_t end,
               int /*thread_index*/) {
  const int64_t first = begin * kAddElementsPerItem;
  const int64_t last = std::min(arguments.num_elements, end * kAddElementsPerItem);
  ops.add(arguments.output + first, arguments.a + first, arguments.b + first, last - first);
}

}  // namespace

void add_body(const AddArguments& arguments, int64_t begin, int64_t end, int thread_index) {
  add_items(arguments, vector_ops(), begin, end, thread_index);
}

void add(device::HostStream& stream, const AddArguments& arguments) {
  FOLIO_CHECK(arguments.num_elements >= 0, "add over {} elements", arguments.num_elements);
  const int64_t num_items =
      (arguments.num_elements + kAddElementsPerItem - 1) / kAddElementsPerItem;
  stream.launch(make_vector_kernel<AddArguments, &add_items>("add", arguments, num_items,
                                                             grain_for(kAddElementsPerItem)));
}

}  // namespace folio::kernels::cpu

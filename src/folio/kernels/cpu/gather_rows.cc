#include "folio/kernels/cpu/gather_rows.h"

#include <cstring>

#include "folio/base/check.h"
#include "folio/kernels/cpu/work_partition.h"

namespace folio::kernels::cpu {

void gather_rows_body(const GatherRowsArguments& arguments, int64_t begin, int64_t end,
                      int /*thread_index*/) {
  const int64_t num_rows = *arguments.num_rows;
  FOLIO_CHECK(num_rows >= 0 && num_rows <= arguments.max_rows,
              "gather_rows: {} rows requested, room for {}", num_rows, arguments.max_rows);
  const auto row_bytes = static_cast<size_t>(arguments.row_bytes);
  for (int64_t row = begin; row < end; ++row) {
    std::byte* destination = arguments.destination + row * arguments.row_bytes;
    if (row >= num_rows) {
      std::memset(destination, 0, row_bytes);
      continue;
    }
    const int64_t index = arguments.row_indices[row];
    FOLIO_CHECK(index >= 0 && index < arguments.num_source_rows,
                "gather_rows: row {} selects source row {} of {}", row, index,
                arguments.num_source_rows);
    std::memcpy(destination, arguments.source + index * arguments.row_bytes, row_bytes);
  }
}

void gather_rows(device::HostStream& stream, const GatherRowsArguments& arguments) {
  FOLIO_CHECK(arguments.max_rows >= 0 && arguments.row_bytes > 0 && arguments.num_source_rows >= 0,
              "gather_rows shape: {} rows of {} bytes from {} rows", arguments.max_rows,
              arguments.row_bytes, arguments.num_source_rows);
  stream.launch(device::HostKernel::make<GatherRowsArguments, &gather_rows_body>(
      "gather_rows", arguments, arguments.max_rows, grain_for(arguments.row_bytes / 4)));
}

}  // namespace folio::kernels::cpu

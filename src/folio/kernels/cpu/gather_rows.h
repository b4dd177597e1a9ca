// Gathering rows by index: destination[r] = source[row_indices[r]] for r < *num_rows, and zero
// for the remaining rows up to max_rows. The engine uses it to pick the last step token of each
// sequence before the LM head, so only those rows pay for the vocabulary projection.
// The indices and their count are read through pointers at run time (they change every step
// while a captured graph replays); max_rows is the fixed padded size. Rows are byte strings, so
// any element type can be gathered. One work item is one destination row.
#pragma once

#include <cstddef>
#include <cstdint>

#include "folio/device/host_stream.h"

namespace folio::kernels::cpu {

struct GatherRowsArguments {
  const std::byte* source;     // bytes [num_source_rows, row_bytes]
  std::byte* destination;      // bytes [max_rows, row_bytes]; must not overlap source
  const int32_t* row_indices;  // i32 [max_rows]; entries [0, *num_rows) are read, each in
                               // [0, num_source_rows)
  const int32_t* num_rows;     // i32 scalar in [0, max_rows]
  int64_t num_source_rows = 0;
  int64_t max_rows = 0;
  int64_t row_bytes = 0;
};

// Aborts (FOLIO_CHECK) on a count or index out of range: the engine wrote a broken step.
void gather_rows_body(const GatherRowsArguments& arguments, int64_t begin, int64_t end,
                      int thread_index);

// Requires: max_rows >= 0, row_bytes > 0, num_source_rows >= 0.
void gather_rows(device::HostStream& stream, const GatherRowsArguments& arguments);

}  // namespace folio::kernels::cpu

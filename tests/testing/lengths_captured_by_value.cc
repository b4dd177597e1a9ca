#include "testing/lengths_captured_by_value.h"

namespace folio::testing {

void LengthsCapturedByValue::on_capture(kernels::cpu::PagedAttentionArguments& arguments) {
  // The kernel reads at most max_sequences (the bucket's S) lengths.
  const int32_t* lengths = arguments.seq_lens;
  snapshots_.emplace_back(lengths, lengths + arguments.max_sequences);
  arguments.seq_lens = snapshots_.back().data();
}

}  // namespace folio::testing

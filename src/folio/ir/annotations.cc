#include "folio/ir/annotations.h"

namespace folio::ir {

double CostHints::arithmetic_intensity() const {
  const int64_t bytes = bytes_read + bytes_written;
  return bytes == 0 ? 0.0 : static_cast<double>(flops) / static_cast<double>(bytes);
}

std::string_view residency_name(Residency residency) {
  switch (residency) {
    case Residency::kWeight:
      return "weight";
    case Residency::kActivation:
      return "activation";
    case Residency::kKvCache:
      return "kv_cache";
    case Residency::kInput:
      return "input";
    case Residency::kOutput:
      return "output";
  }
  return "invalid";
}

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::kPrefill:
      return "prefill";
    case Phase::kDecode:
      return "decode";
    case Phase::kMixed:
      return "mixed";
  }
  return "invalid";
}

std::string_view modality_name(Modality modality) {
  switch (modality) {
    case Modality::kText:
      return "text";
  }
  return "invalid";
}

}  // namespace folio::ir

// The CUDA factory of builds made without the CUDA toolkit (FOLIO_HAVE_CUDA off).
#include "folio/device/cuda_virtual_memory.h"

namespace folio::device {

Result<std::unique_ptr<VirtualMemory>> make_cuda_virtual_memory(int device_ordinal) {
  if (device_ordinal < 0) {
    return invalid_argument("CUDA device ordinal {} is negative", device_ordinal);
  }
  return unavailable(
      "CUDA virtual memory: this Folio was built without CUDA (the CUDA toolkit was not found "
      "at configure time, or FOLIO_ENABLE_CUDA was OFF)");
}

}  // namespace folio::device

// The factory for CUDA virtual memory: VirtualMemory over one GPU's address space with the
// driver's cuMem* API (cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemSetAccess). This
// header exists in every build and does not include cuda.h; builds without the CUDA toolkit get
// a factory that always answers kUnavailable. The driver library is opened at run time, so a
// binary built with CUDA still runs on a machine without a GPU (the factory says why it cannot
// serve). The implementation is TrackedVirtualMemory (tracked_virtual_memory.h) over
// CudaMemoryPrimitives (cuda/cuda_memory_primitives.h).
#pragma once

#include <memory>

#include "folio/base/result.h"
#include "folio/device/virtual_memory.h"

namespace folio::device {

// Memory on device `device_ordinal` (0-based, as CUDA numbers devices). AddressRange::base holds
// device addresses: they are not host pointers and must not be dereferenced on the CPU.
// Errors: kInvalidArgument for a negative ordinal; kUnavailable when built without CUDA, when
// libcuda.so.1 cannot be loaded, when the driver has no such device, or when the device does not
// support virtual memory management.
Result<std::unique_ptr<VirtualMemory>> make_cuda_virtual_memory(int device_ordinal);

}  // namespace folio::device

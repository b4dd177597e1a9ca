// CudaDriver: the CUDA driver API entry points Folio uses, resolved at run time from
// libcuda.so.1 with dlopen, so that binaries built with the CUDA toolkit never link libcuda and
// still start (and answer kUnavailable) on machines without a GPU or driver.
//
// Each entry is a pointer typed exactly as cuda.h declares the function. cuda.h #defines several
// names to versioned symbols (cuMemcpyHtoD -> cuMemcpyHtoD_v2, cuCtxPushCurrent ->
// cuCtxPushCurrent_v2, ...); the lookup stringizes the macro-expanded name, so it asks dlsym for
// the very symbol whose signature the header describes, never an older ABI of the same name.
//
// Thread-safety: CudaDriver::get() may be called from any thread; the driver is loaded and
// initialized (cuInit) once per process, and the table is immutable afterwards.
#pragma once

#include <cuda.h>

#include <string>

#include "folio/base/result.h"
#include "folio/base/status.h"

namespace folio::device::cuda {

struct CudaDriver {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDriverGetVersion) driver_get_version = nullptr;
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuDeviceGetCount) device_get_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_context_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primary_context_release = nullptr;
  decltype(&::cuCtxPushCurrent) context_push_current = nullptr;
  decltype(&::cuCtxPopCurrent) context_pop_current = nullptr;
  decltype(&::cuMemGetAllocationGranularity) memory_get_allocation_granularity = nullptr;
  decltype(&::cuMemAddressReserve) memory_address_reserve = nullptr;
  decltype(&::cuMemAddressFree) memory_address_free = nullptr;
  decltype(&::cuMemCreate) memory_create = nullptr;
  decltype(&::cuMemRelease) memory_release = nullptr;
  decltype(&::cuMemMap) memory_map = nullptr;
  decltype(&::cuMemUnmap) memory_unmap = nullptr;
  decltype(&::cuMemSetAccess) memory_set_access = nullptr;
  decltype(&::cuMemcpyHtoD) memcpy_host_to_device = nullptr;
  decltype(&::cuMemcpyDtoH) memcpy_device_to_host = nullptr;

  // The process-wide driver table: loads libcuda.so.1, resolves every entry and runs cuInit(0)
  // on first use. kUnavailable (with the loader's or the driver's reason) when the library is
  // missing, an entry point is absent (driver too old), or cuInit fails (no device, driver and
  // kernel module mismatch). The outcome, success or not, is cached.
  static Result<const CudaDriver*> get();

  // OK for CUDA_SUCCESS; otherwise a Status naming `call`, `what` and the driver's error name
  // and text. CUDA_ERROR_OUT_OF_MEMORY maps to kResourceExhausted, CUDA_ERROR_NO_DEVICE and
  // CUDA_ERROR_INVALID_DEVICE to kUnavailable, everything else to kInternal.
  Status check(CUresult result, std::string_view call, std::string_view what) const;
};

}  // namespace folio::device::cuda

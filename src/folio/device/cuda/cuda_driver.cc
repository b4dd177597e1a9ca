#include "folio/device/cuda/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

namespace folio::device::cuda {
namespace {

constexpr const char* kLibraryName = "libcuda.so.1";

// Stringizes after macro expansion, so FOLIO_CUDA_SYMBOL(cuMemcpyHtoD) is "cuMemcpyHtoD_v2".
#define FOLIO_CUDA_SYMBOL_INNER(name) #name
#define FOLIO_CUDA_SYMBOL(name) FOLIO_CUDA_SYMBOL_INNER(name)

// Resolves `symbol` into `entry`; records the first missing symbol's name.
template <typename Entry>
void resolve(void* library, const char* symbol, Entry& entry, std::string& first_missing) {
  entry = reinterpret_cast<Entry>(dlsym(library, symbol));
  if (entry == nullptr && first_missing.empty()) first_missing = symbol;
}

Result<CudaDriver> load() {
  // Never closed: the driver stays loaded for the life of the process, as libcuda expects.
  void* library = dlopen(kLibraryName, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* reason = dlerror();
    return unavailable("CUDA driver: cannot load {} ({}); is the NVIDIA driver installed?",
                       kLibraryName, reason != nullptr ? reason : "unknown reason");
  }
  CudaDriver driver;
  std::string missing;
#define FOLIO_RESOLVE(member, name) \
  resolve(library, FOLIO_CUDA_SYMBOL(name), driver.member, missing)
  FOLIO_RESOLVE(init, cuInit);
  FOLIO_RESOLVE(driver_get_version, cuDriverGetVersion);
  FOLIO_RESOLVE(get_error_name, cuGetErrorName);
  FOLIO_RESOLVE(get_error_string, cuGetErrorString);
  FOLIO_RESOLVE(device_get_count, cuDeviceGetCount);
  FOLIO_RESOLVE(device_get, cuDeviceGet);
  FOLIO_RESOLVE(device_get_attribute, cuDeviceGetAttribute);
  FOLIO_RESOLVE(primary_context_retain, cuDevicePrimaryCtxRetain);
  FOLIO_RESOLVE(primary_context_release, cuDevicePrimaryCtxRelease);
  FOLIO_RESOLVE(context_push_current, cuCtxPushCurrent);
  FOLIO_RESOLVE(context_pop_current, cuCtxPopCurrent);
  FOLIO_RESOLVE(memory_get_allocation_granularity, cuMemGetAllocationGranularity);
  FOLIO_RESOLVE(memory_address_reserve, cuMemAddressReserve);
  FOLIO_RESOLVE(memory_address_free, cuMemAddressFree);
  FOLIO_RESOLVE(memory_create, cuMemCreate);
  FOLIO_RESOLVE(memory_release, cuMemRelease);
  FOLIO_RESOLVE(memory_map, cuMemMap);
  FOLIO_RESOLVE(memory_unmap, cuMemUnmap);
  FOLIO_RESOLVE(memory_set_access, cuMemSetAccess);
  FOLIO_RESOLVE(memcpy_host_to_device, cuMemcpyHtoD);
  FOLIO_RESOLVE(memcpy_device_to_host, cuMemcpyDtoH);
#undef FOLIO_RESOLVE
  if (!missing.empty()) {
    return unavailable(
        "CUDA driver: {} has no entry point {}; the driver is older than Folio's "
        "CUDA {}.{} toolkit needs",
        kLibraryName, missing, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
  }
  const CUresult initialized = driver.init(0);
  if (initialized != CUDA_SUCCESS) {
    return unavailable("{}",
                       driver.check(initialized, "cuInit", "CUDA driver: initializing").message());
  }
  return driver;
}

}  // namespace

Result<const CudaDriver*> CudaDriver::get() {
  static std::once_flag once;
  static Result<CudaDriver>* loaded = nullptr;  // leaked on purpose: outlives static destructors
  std::call_once(once, [] { loaded = new Result<CudaDriver>(load()); });
  if (!loaded->ok()) return loaded->status();
  return &loaded->value();
}

Status CudaDriver::check(CUresult result, std::string_view call, std::string_view what) const {
  if (result == CUDA_SUCCESS) return Status::ok_status();
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_error_name == nullptr || get_error_name(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (get_error_string == nullptr || get_error_string(result, &text) != CUDA_SUCCESS)
    text = nullptr;
  std::string message = fmt::format(
      "{}: {} failed: {} ({})", what, call, name != nullptr ? name : "unknown CUDA error",
      text != nullptr ? text : fmt::format("code {}", static_cast<int>(result)));
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return Status(StatusCode::kResourceExhausted, std::move(message));
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
      return Status(StatusCode::kUnavailable, std::move(message));
    default:
      return Status(StatusCode::kInternal, std::move(message));
  }
}

}  // namespace folio::device::cuda

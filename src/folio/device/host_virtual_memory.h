// The factory for host virtual memory: VirtualMemory over the CPU's own address space, with
// physical memory from anonymous memory files (memfd) and views made by mmap. It is what the
// memory runtime runs on without a GPU, and the reference the CUDA implementation is tested
// against. The implementation is TrackedVirtualMemory (tracked_virtual_memory.h) over
// HostMemoryPrimitives (host/host_memory_primitives.h).
#pragma once

#include <memory>

#include "folio/base/result.h"
#include "folio/device/virtual_memory.h"

namespace folio::device {

// Granularity is the OS page size. Fails only if the OS page size cannot be read.
Result<std::unique_ptr<VirtualMemory>> make_host_virtual_memory();

}  // namespace folio::device

// HostKernelObserver: what a HostStream tells about each kernel it runs, when one is set
// (HostStream::set_observer). The stream times the kernel where it actually runs (launch() in
// eager mode, replay() for a recorded graph; a capture runs nothing and reports nothing), so an
// observer sees eager and replayed execution alike.
//
// Each kernel carries the tag its launcher gave it (HostStream::set_launch_tag; the executor
// tags every launch of an IR op with the op's profile row), recorded with the launch, so a
// replayed kernel reports the tag it was captured with. `first_of_tag` marks the first kernel of
// one tagged unit (one IR op may launch several kernels), so observers can count units.
//
// Thread-safety: on_kernel() is called on the thread that launched or replayed the kernel,
// after every slice of it finished.
#pragma once

#include "folio/device/host_kernel.h"

namespace folio::device {

struct KernelTiming {
  double wall_seconds = 0;  // from the kernel's start to its last slice done, on the launcher
  // The sum of every slice's run time over all threads; at most wall_seconds * num_threads.
  double busy_seconds = 0;
  int num_threads = 1;  // of the pool it ran on
};

class HostKernelObserver {
 public:
  virtual ~HostKernelObserver() = default;
  virtual void on_kernel(const HostKernel& kernel, const KernelTiming& timing) = 0;
};

}  // namespace folio::device

// Collectives: what one member (a rank) of a worker group can do with the others. A group has
// `size()` members numbered 0..size-1; every member holds its own Collectives object and calls
// the same collective operations in the same order with matching arguments. Tensor parallelism
// sums partial results with all_reduce_sum; pipeline parallelism hands activations from one
// stage to the next with send/recv.
//
// Backends: InProcessGroup (in_process_collectives.h, members are threads of one process, for
// tests and single-machine use) and GlooGroup (gloo_collectives.h, members are processes over
// TCP). NCCL follows with the CUDA backend. The contract below is tested once against every
// backend (tests/dist/collectives_contract.h).
//
// Contract, for every backend:
// - Every operation is bounded by the group's timeout (`timeout()`, fixed when the group is
//   formed): it never waits forever for a peer. A peer that is gone, hung, or calls another
//   operation (or the same one with another size) makes the call fail within about the
//   timeout with a Status naming this rank, the operation and what happened; the process is
//   never aborted for it.
// - Errors come in two kinds. A local argument error (a peer or root outside the group, an
//   output of the wrong size, overlapping spans) is kInvalidArgument, found before any
//   communication, and leaves the group usable; the peers of that call will time out, though,
//   since this member never joined it. Every other error breaks the group: from then on
//   every call on this member returns kFailedPrecondition quoting the first error. A broken
//   group is not repaired; recovery forms a new group (a new epoch, see docs/design/dist.md).
// - An operation on zero elements or bytes returns at once without communicating.
// - all_reduce_sum gives bit-identical results on every member. The order of the additions is
//   the backend's and is documented there (in-process: rank order; gloo: its ring order); for
//   two members both equal the rank-order sum, since float addition is commutative.
//
// Thread-safety: a Collectives object belongs to one thread at a time (its rank's worker
// thread); different members may be used from different threads concurrently.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string_view>

#include "folio/base/status.h"

namespace folio::dist {

// The operations, for messages and for matching calls across members.
enum class CollectiveOp {
  kAllReduceSum,
  kAllGather,
  kBroadcast,
  kSend,
  kRecv,
  kBarrier,
};

std::string_view collective_op_name(CollectiveOp op);

class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The bound on every operation of this group.
  virtual std::chrono::milliseconds timeout() const = 0;

  // Replaces values[i] on every member by the sum over members of their values[i]. Every
  // member passes the same number of elements. f32 [count], in place.
  virtual Status all_reduce_sum(std::span<float> values) = 0;

  // output = the inputs of members 0, 1, ..., size-1, one after the other. Every member passes
  // inputs of the same size. Requires: output.size() == input.size() * size(), input and
  // output do not overlap.
  virtual Status all_gather(std::span<const std::byte> input, std::span<std::byte> output) = 0;
  Status all_gather(std::span<const float> input, std::span<float> output) {
    return all_gather(std::as_bytes(input), std::as_writable_bytes(output));
  }

  // Copies `root`'s buffer into every other member's buffer (of the same size).
  virtual Status broadcast(std::span<std::byte> buffer, int root) = 0;

  // Point to point, for pipeline activations. send returns once the matching recv has been
  // posted by `peer` and the bytes have left this member (so two members that both send to
  // each other before receiving wait for each other until the timeout: post one side's recv
  // first). recv requires the sender to send exactly buffer.size() bytes; messages between
  // two members arrive in the order they were sent.
  virtual Status send(std::span<const std::byte> bytes, int peer) = 0;
  virtual Status recv(std::span<std::byte> buffer, int peer) = 0;

  // Returns once every member has entered the barrier.
  virtual Status barrier() = 0;
};

// The argument checks every backend makes before communicating (kInvalidArgument, naming the
// rank and operation), so both report the same mistakes with the same words.
Status check_peer(const Collectives& member, CollectiveOp op, int peer);
Status check_root(const Collectives& member, int root);
Status check_all_gather_sizes(const Collectives& member, size_t input_bytes, size_t output_bytes,
                              bool overlap);

// True when the byte ranges share a byte.
bool spans_overlap(std::span<const std::byte> a, std::span<const std::byte> b);

}  // namespace folio::dist

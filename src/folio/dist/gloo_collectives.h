// The gloo backend: members are processes (or threads) connected over TCP by gloo
// (gloo::transport::tcp), the collective library PyTorch uses on CPU. Each member forms its
// side of the group with connect_gloo_group; the members find each other through a rendezvous
// store and then hold one TCP connection per pair (a full mesh).
//
// Rendezvous: gloo's FileStore in `store_directory`, a directory every member can reach (local
// or shared); or, without a directory, the store that member 0's worker serves over gRPC at
// `store_address` (rendezvous_store.h), for members with no file system in common. Keys are
// prefixed with the group id and epoch ("folio.<group_id>.<epoch>."), so a group formed again after
// a failure (a new epoch) never reads a dead member's address; the store's files of old epochs can
// be removed once no member of that epoch connects. Every wait on the store is bounded by the
// group's timeout (gloo's own default is 30 s whatever the context says).
//
// Timeouts and failures: the timeout is set on the gloo context and passed to every
// operation. Every gloo exception becomes a Status (a timeout kDeadlineExceeded, a closed or
// reset connection kUnavailable, anything else kInternal) that names this rank and the
// operation, and breaks the group (gloo closes every connection of a context after a timeout).
// SIGPIPE is ignored in the whole process once the first group forms (only when its
// disposition is still the default): a write to a dead peer then fails with EPIPE, which gloo
// reports, instead of killing the process without a word.
//
// Matching calls: gloo matches messages by "slot"; each call's slot carries a hash of its size
// (and root), so members that disagree on a size time out instead of handing gloo a message
// longer than the buffer posted for it (which gloo treats as a fatal error of its I/O thread,
// aborting the process). Sizes therefore cannot be told apart from a slow peer: the error says
// both are possible. Two different sizes share a slot with probability 2^-32.
//
// Addition order of all_reduce_sum: gloo's ring algorithm. The buffer is cut into segments; a
// segment's sum starts at one member and travels the ring, each member adding its own values
// (received + local), and the finished segment is then copied to every member. So all members
// get bit-identical results, but for three or more members the order of additions differs
// from segment to segment and from the in-process backend's rank order; the result is within
// (size - 1) * 2^-24 * sum(|x_i|) of the exact sum, as any order is. For two members it is
// bit-identical to the rank-order sum.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "folio/base/result.h"
#include "folio/dist/collectives.h"

namespace folio::dist {

struct GlooGroupOptions {
  int rank = 0;
  int size = 1;
  // The rendezvous directory; must exist. Empty: the gRPC store at store_address.
  std::string store_directory;
  // HOST:PORT of the worker serving the group's rendezvous store (member 0's).
  std::string store_address;
  // Names the group in the store: letters, digits, '-' and '_'.
  std::string group_id = "folio";
  // Incremented each time the group is formed again.
  uint64_t epoch = 0;
  // The address this member listens on for its peers.
  std::string host = "127.0.0.1";
  // Bounds forming the group and every operation.
  std::chrono::milliseconds timeout{30000};
};

// Forms this member's side of the group: returns once connected to every other member, or an
// error when one does not join within the timeout (kDeadlineExceeded naming the ranks that did
// not publish an address), the options are malformed (kInvalidArgument) or the store or the
// network fails (kUnavailable, kInternal).
Result<std::unique_ptr<Collectives>> connect_gloo_group(const GlooGroupOptions& options);

}  // namespace folio::dist

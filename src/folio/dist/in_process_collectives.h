// The in-process backend: a group whose members are threads of one process, exchanging data
// through shared memory. It serves the unit tests of everything built on Collectives and
// single-machine use; it follows the contract of collectives.h exactly, timeouts and broken
// groups included, so code tested against it behaves the same on gloo.
//
// How a collective runs: each member publishes a description of its call (operation, size,
// root) and a pointer to its buffer, then waits at a step until every member has arrived; the
// descriptions are compared (a mismatch is kInvalidArgument on every member and breaks the
// group); each member then reads the others' buffers directly and computes its own result into
// private scratch, and waits at a second step until everyone is done reading before it writes
// its own buffer and returns. So no member's buffer is read after its call returned.
//
// Addition order: all_reduce_sum computes ((x_0 + x_1) + x_2) + ... + x_{n-1} element by
// element in f32, in rank order, on every member: results are bit-identical across members and
// do not depend on timing.
//
// send/recv: the sender posts a pointer in the (sender, receiver) mailbox and waits until the
// receiver has copied the bytes (a rendezvous, as gloo's send completes only once the receiver
// has posted its recv). A receiver that expects another size gets kInvalidArgument (so does the
// sender) and the group breaks.
//
// A member whose Collectives is destroyed leaves the group: the others' calls fail with
// kUnavailable naming it (as gloo peers see a closed connection).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "folio/base/result.h"
#include "folio/dist/collectives.h"

namespace folio::dist {

// Members 0..size-1, each to be used by its own thread (member i has rank i). Errors: size < 1
// or a timeout that is not positive (kInvalidArgument).
Result<std::vector<std::unique_ptr<Collectives>>> make_in_process_group(
    int size, std::chrono::milliseconds timeout);

}  // namespace folio::dist

// ignore_sigpipe_once(): a write to a peer that vanished (a gloo rank, a worker's gRPC stream)
// must fail with EPIPE, not end this process: SIGPIPE's default action kills it silently. gRPC
// sends with MSG_NOSIGNAL on most paths and gloo on none, so whatever holds a connection to a
// peer calls this first.
//
// Only a default disposition is changed: a handler the program installed stays. Thread-safe.
#pragma once

namespace folio::dist {

void ignore_sigpipe_once();

}  // namespace folio::dist

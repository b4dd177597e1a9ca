// HttpMetrics: the front end's connection series in the metrics registry that /metrics renders
// (the request series are ServerMetrics').
//
// Series:
//   folio_server_connections_open                gauge: client sockets open now
//   folio_server_connections_accepted_total      counter: sockets accepted
//   folio_server_connections_refused_total       counter: sockets closed at once because
//                                                 max_connections were open
//   folio_server_timeouts_total{kind}            counter: connections closed by a timeout, by
//                                                 kind: "idle" (no request began within the idle
//                                                 timeout), "header", "body", "write"
//   folio_server_client_disconnects_total        counter: requests abandoned because the
//                                                 client went away (closed, reset, or stopped
//                                                 reading past the write timeout) before the
//                                                 answer's last byte
//
// Lifetime: the registry must outlive this object. Thread-safety: every member may be used from
// any thread (the registry's metrics are atomic).
#pragma once

#include <memory>

#include "folio/base/metrics.h"
#include "folio/base/result.h"

namespace folio::server {

enum class HttpTimeout : uint8_t { kIdle, kHeader, kBody, kWrite };

struct HttpMetrics {
  // Errors: the registry's, for families that conflict with ones registered before.
  static Result<HttpMetrics> create(metrics::Registry& registry);

  metrics::Counter& timeouts(HttpTimeout kind) const;

  metrics::Gauge* connections_open = nullptr;
  metrics::Counter* connections_accepted = nullptr;
  metrics::Counter* connections_refused = nullptr;
  metrics::Counter* client_disconnects = nullptr;
  metrics::Counter* idle_timeouts = nullptr;
  metrics::Counter* header_timeouts = nullptr;
  metrics::Counter* body_timeouts = nullptr;
  metrics::Counter* write_timeouts = nullptr;
};

}  // namespace folio::server

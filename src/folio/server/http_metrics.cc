#include "folio/server/http_metrics.h"

namespace folio::server {
namespace {

constexpr char kTimeoutsName[] = "folio_server_timeouts_total";
constexpr char kTimeoutsHelp[] =
    "Connections closed by a timeout: idle (no request began), header, body, write (the client "
    "stopped reading).";

}  // namespace

Result<HttpMetrics> HttpMetrics::create(metrics::Registry& registry) {
  HttpMetrics result;
  FOLIO_ASSIGN_OR_RETURN(result.connections_open,
                         registry.gauge("folio_server_connections_open", "Client sockets open."));
  FOLIO_ASSIGN_OR_RETURN(
      result.connections_accepted,
      registry.counter("folio_server_connections_accepted_total", "Client sockets accepted."));
  FOLIO_ASSIGN_OR_RETURN(
      result.connections_refused,
      registry.counter("folio_server_connections_refused_total",
                       "Client sockets closed at once because the connection limit was reached."));
  FOLIO_ASSIGN_OR_RETURN(
      result.client_disconnects,
      registry.counter("folio_server_client_disconnects_total",
                       "Requests abandoned because the client closed the connection or stopped "
                       "reading before the answer's last byte (their generation is cancelled)."));
  FOLIO_ASSIGN_OR_RETURN(result.idle_timeouts,
                         registry.counter(kTimeoutsName, kTimeoutsHelp, {{"kind", "idle"}}));
  FOLIO_ASSIGN_OR_RETURN(result.header_timeouts,
                         registry.counter(kTimeoutsName, kTimeoutsHelp, {{"kind", "header"}}));
  FOLIO_ASSIGN_OR_RETURN(result.body_timeouts,
                         registry.counter(kTimeoutsName, kTimeoutsHelp, {{"kind", "body"}}));
  FOLIO_ASSIGN_OR_RETURN(result.write_timeouts,
                         registry.counter(kTimeoutsName, kTimeoutsHelp, {{"kind", "write"}}));
  return result;
}

metrics::Counter& HttpMetrics::timeouts(HttpTimeout kind) const {
  switch (kind) {
    case HttpTimeout::kIdle:
      return *idle_timeouts;
    case HttpTimeout::kHeader:
      return *header_timeouts;
    case HttpTimeout::kBody:
      return *body_timeouts;
    case HttpTimeout::kWrite:
      return *write_timeouts;
  }
  return *idle_timeouts;
}

}  // namespace folio::server

// ServerMetrics: the HTTP server's own series in the metrics registry that /metrics renders,
// beside the engine's (folio_engine_*: waiting and running sequences, KV blocks by state,
// prefix-cache hit rate, preemptions, time to first token, time per output token, prompt and
// generated tokens), the page pool's (folio_pool_*: bytes by content type) and the graph
// cache's (folio_graph_*).
//
// Series:
//   folio_server_requests_total{endpoint, status}   counter: every answered HTTP request, by
//                                                    route ("/v1/completions", ..., "other") and
//                                                    status code (so 400s, 429s, 503s show)
//   folio_server_requests_in_flight                 gauge: generation requests accepted and not
//                                                    yet answered (what the queue limit bounds)
//   folio_server_request_duration_seconds{endpoint} histogram: end-to-end latency of generation
//                                                    requests, arrival to last byte
//   folio_server_graph_hit_rate                     gauge (read at render): steps replayed from
//                                                    a captured graph / graph lookups, when the
//                                                    served model has an executor
//
// Lifetime: the registry must outlive this object; the destructor removes the gauge function,
// so the registry never calls into a destroyed server.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "folio/base/metrics.h"
#include "folio/base/result.h"
#include "folio/exec/graph_cache.h"

namespace folio::server {

class ServerMetrics {
 public:
  // `graph_stats` may be empty (no graph hit-rate series). Errors: the registry's, for families
  // that conflict with ones already registered.
  static Result<std::unique_ptr<ServerMetrics>> create(
      metrics::Registry& registry, std::function<exec::GraphCacheStats()> graph_stats);
  ~ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  void on_response(std::string_view endpoint, int status);
  void on_generation_done(std::string_view endpoint, double seconds);
  void add_in_flight(int delta) { in_flight_->add(delta); }

 private:
  explicit ServerMetrics(metrics::Registry& registry) : registry_(registry) {}

  metrics::Registry& registry_;
  metrics::Gauge* in_flight_ = nullptr;
  bool has_graph_gauge_ = false;
};

}  // namespace folio::server

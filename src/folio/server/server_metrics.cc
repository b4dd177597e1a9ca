#include "folio/server/server_metrics.h"

#include <string>

#include "folio/base/check.h"

namespace folio::server {
namespace {

constexpr char kRequestsName[] = "folio_server_requests_total";
constexpr char kRequestsHelp[] = "HTTP requests answered, by route and status code.";
constexpr char kDurationName[] = "folio_server_request_duration_seconds";
constexpr char kDurationHelp[] =
    "End-to-end latency of generation requests, from arrival to the last byte of the answer.";
constexpr char kGraphHitRateName[] = "folio_server_graph_hit_rate";

std::vector<double> duration_buckets() {
  return metrics::exponential_buckets(0.001, 2.0, 18);
}

}  // namespace

Result<std::unique_ptr<ServerMetrics>> ServerMetrics::create(
    metrics::Registry& registry, std::function<exec::GraphCacheStats()> graph_stats) {
  std::unique_ptr<ServerMetrics> server_metrics(new ServerMetrics(registry));
  FOLIO_ASSIGN_OR_RETURN(
      server_metrics->in_flight_,
      registry.gauge("folio_server_requests_in_flight",
                     "Generation requests accepted and not yet answered (bounded by the queue "
                     "limit)."));
  // Registered up front so conflicts surface at start-up, and the families exist before the
  // first request.
  FOLIO_RETURN_IF_ERROR(
      registry.counter(kRequestsName, kRequestsHelp, {{"endpoint", "/health"}, {"status", "200"}})
          .status());
  FOLIO_RETURN_IF_ERROR(registry
                            .histogram(kDurationName, kDurationHelp, duration_buckets(),
                                       {{"endpoint", "/v1/completions"}})
                            .status());
  if (graph_stats) {
    FOLIO_RETURN_IF_ERROR(registry.gauge_function(
        kGraphHitRateName,
        "Steps replayed from a captured graph / steps looked up in the graph cache (0 before "
        "any step).",
        {}, [graph_stats = std::move(graph_stats)] {
          const exec::GraphCacheStats stats = graph_stats();
          const int64_t lookups = stats.hits + stats.misses;
          return lookups == 0 ? 0.0 : static_cast<double>(stats.hits) / lookups;
        }));
    server_metrics->has_graph_gauge_ = true;
  }
  return server_metrics;
}

ServerMetrics::~ServerMetrics() {
  if (has_graph_gauge_) {
    const Status removed = registry_.remove_gauge_function(kGraphHitRateName, {});
    FOLIO_CHECK(removed.ok(), "removing {}: {}", kGraphHitRateName, removed.to_string());
  }
}

void ServerMetrics::on_response(std::string_view endpoint, int status) {
  Result<metrics::Counter*> counter =
      registry_.counter(kRequestsName, kRequestsHelp,
                        {{"endpoint", std::string(endpoint)}, {"status", std::to_string(status)}});
  FOLIO_CHECK(counter.ok(), "{}: {}", kRequestsName, counter.status().to_string());
  (*counter)->increment();
}

void ServerMetrics::on_generation_done(std::string_view endpoint, double seconds) {
  Result<metrics::Histogram*> histogram = registry_.histogram(
      kDurationName, kDurationHelp, duration_buckets(), {{"endpoint", std::string(endpoint)}});
  FOLIO_CHECK(histogram.ok(), "{}: {}", kDurationName, histogram.status().to_string());
  (*histogram)->observe(seconds);
}

}  // namespace folio::server

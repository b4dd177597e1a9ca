// ShardSource: the coordinator's side of the weight cache (issue 15, slice 5). It holds the
// model file the coordinator opened and sends a stage's shard to a worker that has no model
// file: the stage's manifest (shard_manifest.h, made once per layer range and kept), then,
// over one client-streaming call, only the tensors the worker's cache lacks or found corrupted.
// A worker whose cache is warm is sent nothing but the manifest.
//
// Thread-safety: send() and the counters may be called from any thread; the manifests are made
// under a mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "folio/base/metrics.h"
#include "folio/base/mutex.h"
#include "folio/base/result.h"
#include "folio/dist/pipeline_stage.h"
#include "folio/dist/shard_manifest.h"
#include "folio/dist/worker_client.h"
#include "folio/gguf/gguf_file.h"

namespace folio::dist {

// What one send() moved.
struct ShardTransfer {
  int64_t bytes_fetched = 0;  // tensor bytes streamed to the worker
  int64_t bytes_cached = 0;   // tensor bytes the worker's cache held, verified
  int32_t tensors_fetched = 0;
  int32_t corrupted_entries = 0;  // entries the worker found corrupted and dropped
};

class ShardSource {
 public:
  // `model_file` (the coordinator's model, whose hash is `model_hash`) must outlive the source.
  ShardSource(const gguf::GgufFile& model_file, std::string model_hash);

  // Offers `worker` the shard of `shard`'s layers in `epoch` and streams the tensors it lacks.
  // Errors: the manifest's (a layer range outside the model), the worker's (no cache, a stale
  // epoch, refused bytes), with the worker and the layers named.
  Result<ShardTransfer> send(WorkerClient& worker, const model::LlamaShard& shard, uint64_t epoch);

  // The manifest of `shard`'s layers (made on first use, then kept).
  Result<const ShardManifest*> manifest(const model::LlamaShard& shard);

  // Tensor bytes streamed to workers since the source was made.
  int64_t bytes_fetched_total() const { return bytes_fetched_total_.load(); }
  // Registers folio_dist_weight_bytes_fetched_total, fed by every later send().
  Status export_to(metrics::Registry& registry);

 private:
  const gguf::GgufFile& model_file_;
  const std::string model_hash_;
  Mutex mutex_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<ShardManifest>> manifests_
      FOLIO_GUARDED_BY(mutex_);
  std::atomic<int64_t> bytes_fetched_total_{0};
  std::atomic<metrics::Counter*> bytes_fetched_metric_{nullptr};
};

// Prepares `spec` on `worker` in `epoch` (WorkerClient::prepare_stage); a worker that holds no
// model file (info().model.hash empty) is first sent its shard by `source` when one is given.
// `transfer`, when not null, receives what was sent.
Result<PreparedStage> prepare_stage_with_weights(WorkerClient& worker, ShardSource* source,
                                                 const PipelineStageSpec& spec,
                                                 const std::string& model_hash, uint64_t epoch,
                                                 ShardTransfer* transfer = nullptr);

}  // namespace folio::dist

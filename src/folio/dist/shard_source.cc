#include "folio/dist/shard_source.h"

#include <vector>

#include "folio/base/log.h"

namespace folio::dist {

ShardSource::ShardSource(const gguf::GgufFile& model_file, std::string model_hash)
    : model_file_(model_file), model_hash_(std::move(model_hash)) {}

Result<const ShardManifest*> ShardSource::manifest(const model::LlamaShard& shard) {
  const MutexLock lock(mutex_);
  const auto key = std::make_pair(shard.first_layer, shard.end_layer);
  if (const auto found = manifests_.find(key); found != manifests_.end()) {
    return found->second.get();
  }
  FOLIO_ASSIGN_OR_RETURN(ShardManifest made, make_shard_manifest(model_file_, model_hash_, shard));
  auto owned = std::make_unique<ShardManifest>(std::move(made));
  const ShardManifest* pointer = owned.get();
  manifests_.emplace(key, std::move(owned));
  return pointer;
}

Result<ShardTransfer> ShardSource::send(WorkerClient& worker, const model::LlamaShard& shard,
                                        uint64_t epoch) {
  const std::string context =
      fmt::format("sending the weights of layers [{}, {}) to worker {}", shard.first_layer,
                  shard.end_layer, worker.info().address);
  Result<const ShardManifest*> made = manifest(shard);
  if (!made.ok()) return made.status().with_context(context);
  const ShardManifest& manifest = **made;
  Result<ShardOffer> offer = worker.offer_shard(manifest, epoch);
  if (!offer.ok()) return offer.status().with_context(context);
  std::vector<TensorUpload> uploads;
  ShardTransfer transfer;
  transfer.bytes_cached = offer->cached_bytes;
  transfer.corrupted_entries = offer->corrupted_entries;
  for (const ContentHash& hash : offer->missing) {
    const ShardTensor* tensor = nullptr;
    for (const ShardTensor& candidate : manifest.tensors) {
      if (candidate.hash == hash) tensor = &candidate;
    }
    if (tensor == nullptr) {
      return failed_precondition("{}: the worker asked for {}, which is not in the shard", context,
                                 hash.to_string());
    }
    Result<gguf::GgufTensor> bytes = model_file_.tensor(tensor->name);
    if (!bytes.ok()) return bytes.status().with_context(context);
    uploads.push_back(TensorUpload{.hash = hash, .bytes = bytes->data});
    ++transfer.tensors_fetched;
  }
  if (!uploads.empty()) {
    Result<int64_t> pushed = worker.push_tensors(uploads);
    if (!pushed.ok()) return pushed.status().with_context(context);
    transfer.bytes_fetched = *pushed;
  }
  bytes_fetched_total_.fetch_add(transfer.bytes_fetched);
  if (metrics::Counter* counter = bytes_fetched_metric_.load(); counter != nullptr) {
    counter->increment(static_cast<double>(transfer.bytes_fetched));
  }
  log::info(
      "folio coordinator: worker {} fetched {} weight bytes ({} tensors) for layers [{}, "
      "{}); {} bytes were in its cache{}",
      worker.info().address, transfer.bytes_fetched, transfer.tensors_fetched, shard.first_layer,
      shard.end_layer, transfer.bytes_cached,
      transfer.corrupted_entries > 0
          ? fmt::format(" ({} corrupted entries fetched again)", transfer.corrupted_entries)
          : "");
  return transfer;
}

Status ShardSource::export_to(metrics::Registry& registry) {
  FOLIO_ASSIGN_OR_RETURN(
      metrics::Counter * counter,
      registry.counter("folio_dist_weight_bytes_fetched_total",
                       "Tensor bytes the coordinator streamed to workers without the model file "
                       "(what their weight caches lacked)."));
  bytes_fetched_metric_.store(counter);
  return Status();
}

Result<PreparedStage> prepare_stage_with_weights(WorkerClient& worker, ShardSource* source,
                                                 const PipelineStageSpec& spec,
                                                 const std::string& model_hash, uint64_t epoch,
                                                 ShardTransfer* transfer) {
  if (source != nullptr && worker.info().model.hash.empty()) {
    FOLIO_ASSIGN_OR_RETURN(
        const ShardTransfer sent,
        source->send(worker, model::LlamaShard{spec.first_layer, spec.end_layer}, epoch));
    if (transfer != nullptr) *transfer = sent;
  }
  return worker.prepare_stage(spec, model_hash, epoch);
}

}  // namespace folio::dist

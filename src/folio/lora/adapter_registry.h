// AdapterRegistry: the adapters a server knows, by name: where each one's file is, what it
// holds and the namespace its KV lives under. Registering validates the file against the base
// model (adapter_file.h) and keeps only metadata, so thousands of registered adapters cost
// memory for their names and paths, not their weights; the weights come and go with the tiers
// (adapter_manager.h).
//
// Ids are never reused: an adapter removed and registered again under the same name gets a new
// id, and its KV namespace is derived from its content (the file bytes and the scale), never
// its name, so KV computed under the old weights can never serve the new ones.
//
// Thread-safety: every method may be called from any thread (the server registers and looks up
// adapters while the engine thread resolves ids).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "folio/base/mutex.h"
#include "folio/base/result.h"
#include "folio/model/llama_model_file.h"

namespace folio::lora {

// 0 is the base model; adapters are numbered from 1.
using AdapterId = int64_t;

struct AdapterInfo {
  AdapterId id = 0;
  std::string name;
  std::string path;
  float user_scale = 1.0f;
  // FNV-1a of the file bytes, mixed with the user scale: what the adapter computes. Never 0.
  uint64_t content_hash = 0;
  int64_t max_rank = 0;
  int32_t num_targets = 0;  // projections the adapter updates
  int64_t file_bytes = 0;
  int64_t hot_bytes = 0;   // its weights in f16 (the hot tier)
  int64_t warm_bytes = 0;  // its weights in int8 (the warm tier)

  // The KV-cache namespace of requests using it (kv::CacheNamespace::adapter_id): positive.
  int64_t kv_namespace() const { return static_cast<int64_t>(content_hash >> 1) | 1; }
};

// What an adapter computes, for its KV namespace: the file's FNV-1a mixed with the user scale.
// Never 0.
uint64_t adapter_content_hash(uint64_t file_hash, float user_scale);

class AdapterRegistry {
 public:
  explicit AdapterRegistry(model::LlamaShape base) : base_(std::move(base)) {}

  // Opens and validates `path` against the base model and registers it as `name`. Errors:
  // kInvalidArgument for a bad name or scale, or any error of opening the file (naming the file
  // and tensor); kAlreadyExists for a name in use. A failed registration changes nothing.
  Result<AdapterInfo> add(const std::string& name, const std::string& path, float user_scale);
  // Forgets `name` (kNotFound if unknown); returns what it was. The caller (the adapter manager)
  // frees its weights once no request uses them.
  Result<AdapterInfo> remove(const std::string& name);

  std::optional<AdapterInfo> find(const std::string& name) const;
  std::optional<AdapterInfo> get(AdapterId id) const;
  std::vector<AdapterInfo> list() const;  // by name
  int64_t size() const;
  const model::LlamaShape& base() const { return base_; }

 private:
  const model::LlamaShape base_;
  mutable Mutex mutex_;
  AdapterId next_id_ FOLIO_GUARDED_BY(mutex_) = 1;
  std::map<std::string, AdapterId> by_name_ FOLIO_GUARDED_BY(mutex_);
  std::map<AdapterId, AdapterInfo> by_id_ FOLIO_GUARDED_BY(mutex_);
};

}  // namespace folio::lora

// ModelCatalog: the models a server answers to. The base model goes by its served name and is
// adapter id 0; every LoRA adapter registered with the engine's adapter manager goes by its
// registered name. The catalog resolves the OpenAI `model` field of a request to the adapter id
// the engine runs, lists the models for GET /v1/models, and registers and unregisters adapters
// for POST /v1/load_lora_adapter and /v1/unload_lora_adapter when loading at run time is on.
//
// The catalog holds no list of its own: the adapter manager's registry is the one source, so
// adapters given at start-up (--lora, --lora-dir) and adapters loaded over HTTP are the same
// kind of entry, and nothing can disagree about which names exist.
//
// Names: the base's served name always means the base. No adapter may take it (a load under it
// is refused, and create() refuses a manager that already has one), so a name never selects
// two models.
//
// Unloading: allowed while requests use the adapter. The registry forgets the name at once, so
// resolve() and Engine::submit refuse new requests for it; requests already running finish
// with it, and the manager frees its weights when the last of them ends (adapter_manager.h).
//
// Thread-safety: every method may be called from any thread. The catalog itself is immutable;
// the adapter manager's register_adapter, unregister_adapter, find and list are thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/result.h"
#include "folio/lora/adapter_manager.h"
#include "folio/server/openai_protocol.h"

namespace folio::server {

class ModelCatalog {
 public:
  // `adapters` (borrowed, may be null: the base model alone) must outlive the catalog.
  // kInvalidArgument: loading allowed without an adapter manager; an adapter registered under
  // the base's name.
  static Result<ModelCatalog> create(std::string base_name, lora::AdapterManager* adapters,
                                     bool allow_loading);

  const std::string& base_name() const { return base_name_; }
  bool has_adapters() const { return adapters_ != nullptr; }
  // OK when adapters may be loaded and unloaded at run time; else kFailedPrecondition saying
  // how to turn it on.
  Status check_loading_allowed() const;

  // The adapter id `name` selects: 0 for the base. kNotFound naming it when it is neither the
  // base nor a registered adapter.
  Result<int64_t> resolve(std::string_view name) const;
  // The base first, then every adapter by name.
  std::vector<ModelEntry> models() const;

  // Registers the adapter file (validated against the base model; nothing is read into memory
  // until a request uses it) and returns its entry. Errors change nothing:
  // kFailedPrecondition when loading is off; kInvalidArgument for the base's name, a bad name,
  // or a file that does not fit the base (naming the file and the tensor); kAlreadyExists for a
  // name in use; the file's own errors (kNotFound, kDataLoss).
  Result<ModelEntry> load(const LoadAdapterRequest& request) const;
  // Forgets the adapter `name` (see "Unloading" above). kFailedPrecondition when loading is
  // off; kNotFound naming it when no adapter has that name (the base cannot be unloaded).
  Status unload(const std::string& name) const;

 private:
  ModelCatalog(std::string base_name, lora::AdapterManager* adapters, bool allow_loading)
      : base_name_(std::move(base_name)), adapters_(adapters), allow_loading_(allow_loading) {}

  ModelEntry adapter_entry(const std::string& name) const;

  std::string base_name_;
  lora::AdapterManager* adapters_ = nullptr;
  bool allow_loading_ = false;
};

}  // namespace folio::server

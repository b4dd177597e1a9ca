#include "folio/server/model_catalog.h"

#include <fmt/format.h>

namespace folio::server {

Result<ModelCatalog> ModelCatalog::create(std::string base_name, lora::AdapterManager* adapters,
                                          bool allow_loading) {
  if (allow_loading && adapters == nullptr) {
    return invalid_argument(
        "loading LoRA adapters at run time needs an engine started with adapters "
        "(ModelEngineOptions::adapters)");
  }
  if (adapters != nullptr && adapters->find(base_name).has_value()) {
    return invalid_argument(
        "the adapter '{}' has the served model's name, so requests could not choose between "
        "them; register it under another name or serve the model under another "
        "(--model-name)",
        base_name);
  }
  return ModelCatalog(std::move(base_name), adapters, allow_loading);
}

Result<int64_t> ModelCatalog::resolve(std::string_view name) const {
  if (name == base_name_) return int64_t{0};
  if (adapters_ != nullptr) {
    if (std::optional<lora::AdapterInfo> info = adapters_->find(std::string(name))) {
      return info->id;
    }
  }
  const int64_t num_adapters =
      adapters_ == nullptr ? 0 : static_cast<int64_t>(adapters_->list().size());
  if (num_adapters == 0) {
    return not_found("the model '{}' does not exist; this server serves '{}'", name, base_name_);
  }
  return not_found(
      "the model '{}' does not exist; this server serves '{}' and {} LoRA adapter{} (GET "
      "/v1/models lists them)",
      name, base_name_, num_adapters, num_adapters == 1 ? "" : "s");
}

std::vector<ModelEntry> ModelCatalog::models() const {
  std::vector<ModelEntry> models = {ModelEntry{base_name_, base_name_, std::nullopt}};
  if (adapters_ != nullptr) {
    for (const lora::AdapterInfo& info : adapters_->list()) {
      models.push_back(adapter_entry(info.name));
    }
  }
  return models;
}

Result<ModelEntry> ModelCatalog::load(const LoadAdapterRequest& request) const {
  FOLIO_RETURN_IF_ERROR(check_loading_allowed());
  if (request.name == base_name_) {
    return invalid_argument("'{}' is the served model's name; choose another for the adapter",
                            request.name);
  }
  Result<lora::AdapterInfo> info =
      adapters_->register_adapter(request.name, request.path, request.scale);
  if (!info.ok()) {
    return info.status().with_context(fmt::format("cannot load adapter '{}'", request.name));
  }
  return adapter_entry(info->name);
}

Status ModelCatalog::unload(const std::string& name) const {
  FOLIO_RETURN_IF_ERROR(check_loading_allowed());
  if (name == base_name_) {
    return not_found("'{}' is the served model, not an adapter; only adapters can be unloaded",
                     name);
  }
  return adapters_->unregister_adapter(name);
}

ModelEntry ModelCatalog::adapter_entry(const std::string& name) const {
  return ModelEntry{name, base_name_, base_name_};
}

Status ModelCatalog::check_loading_allowed() const {
  if (allow_loading_) return Status();
  return failed_precondition(
      "this server does not load or unload LoRA adapters at run time; start it with "
      "--allow-lora-loading to turn the adapter routes on");
}

}  // namespace folio::server

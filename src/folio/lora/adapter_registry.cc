#include "folio/lora/adapter_registry.h"

#include <bit>
#include <cmath>

#include "folio/base/random.h"
#include "folio/kernels/lora.h"
#include "folio/lora/adapter_file.h"

namespace folio::lora {
namespace {

Status validate_name(const std::string& name) {
  if (name.empty() || name.size() > 256) {
    return invalid_argument("adapter name '{}' must have 1 to 256 characters", name);
  }
  if (name == "base") return invalid_argument("adapter name 'base' is reserved for the base model");
  for (const char c : name) {
    if (static_cast<unsigned char>(c) < 0x20 || c == '=' || c == ',') {
      return invalid_argument("adapter name '{}' has a control character, '=' or ','", name);
    }
  }
  return Status();
}

}  // namespace

uint64_t adapter_content_hash(uint64_t file_hash, float user_scale) {
  const uint64_t scale_bits = std::bit_cast<uint32_t>(user_scale);
  const uint64_t hash = file_hash ^ (scale_bits * 0x9e3779b97f4a7c15ULL);
  return hash == 0 ? 1 : hash;
}

Result<AdapterInfo> AdapterRegistry::add(const std::string& name, const std::string& path,
                                         float user_scale) {
  FOLIO_RETURN_IF_ERROR(validate_name(name));
  if (!std::isfinite(user_scale)) {
    return invalid_argument("adapter '{}': scale {} is not a finite number", name, user_scale);
  }
  {
    MutexLock lock(mutex_);
    if (by_name_.contains(name)) {
      return already_exists("an adapter named '{}' is already registered; unload it first", name);
    }
  }
  // Opening reads and checks the whole file; done outside the lock (it may take milliseconds).
  FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<AdapterFile> file, AdapterFile::open(path, base_));
  AdapterInfo info;
  info.name = name;
  info.path = path;
  info.user_scale = user_scale;
  info.content_hash = adapter_content_hash(file->content_hash(), user_scale);
  info.max_rank = file->max_rank();
  info.num_targets = static_cast<int32_t>(file->pairs().size());
  info.file_bytes = file->file_bytes();
  info.hot_bytes = adapter_weights_bytes(*file, kernels::LoraWeightFormat::kF16);
  info.warm_bytes = adapter_weights_bytes(*file, kernels::LoraWeightFormat::kInt8);

  MutexLock lock(mutex_);
  if (by_name_.contains(name)) {
    return already_exists("an adapter named '{}' is already registered; unload it first", name);
  }
  info.id = next_id_++;
  by_name_.emplace(name, info.id);
  by_id_.emplace(info.id, info);
  return info;
}

Result<AdapterInfo> AdapterRegistry::remove(const std::string& name) {
  MutexLock lock(mutex_);
  auto found = by_name_.find(name);
  if (found == by_name_.end()) return not_found("no adapter named '{}' is registered", name);
  auto entry = by_id_.find(found->second);
  AdapterInfo info = std::move(entry->second);
  by_id_.erase(entry);
  by_name_.erase(found);
  return info;
}

std::optional<AdapterInfo> AdapterRegistry::find(const std::string& name) const {
  MutexLock lock(mutex_);
  auto found = by_name_.find(name);
  if (found == by_name_.end()) return std::nullopt;
  return by_id_.at(found->second);
}

std::optional<AdapterInfo> AdapterRegistry::get(AdapterId id) const {
  MutexLock lock(mutex_);
  auto found = by_id_.find(id);
  if (found == by_id_.end()) return std::nullopt;
  return found->second;
}

std::vector<AdapterInfo> AdapterRegistry::list() const {
  MutexLock lock(mutex_);
  std::vector<AdapterInfo> adapters;
  adapters.reserve(by_name_.size());
  for (const auto& [name, id] : by_name_) adapters.push_back(by_id_.at(id));
  return adapters;
}

int64_t AdapterRegistry::size() const {
  MutexLock lock(mutex_);
  return static_cast<int64_t>(by_id_.size());
}

}  // namespace folio::lora

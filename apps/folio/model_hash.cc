#include "apps/folio/model_hash.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

namespace folio::app {

Result<std::string> model_file_hash(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                       &std::fclose);
  if (file == nullptr) {
    return not_found("cannot open model file '{}': {}", path, std::strerror(errno));
  }
  // FNV-1a 64, the same as base/random.h's fnv1a64, fed in chunks.
  uint64_t hash = 0xcbf29ce484222325ull;
  std::vector<uint8_t> chunk(size_t{1} << 20);
  while (true) {
    const size_t read = std::fread(chunk.data(), 1, chunk.size(), file.get());
    for (size_t i = 0; i < read; ++i) hash = (hash ^ chunk[i]) * 0x100000001b3ull;
    if (read < chunk.size()) break;
  }
  if (std::ferror(file.get())) {
    return data_loss("reading model file '{}' failed midway: {}", path, std::strerror(errno));
  }
  return fmt::format("fnv1a64:{:016x}", hash);
}

Result<dist::ModelIdentity> model_identity(const std::string& path) {
  FOLIO_ASSIGN_OR_RETURN(std::string hash, model_file_hash(path));
  return dist::ModelIdentity{.hash = std::move(hash),
                             .name = std::filesystem::path(path).stem().string()};
}

}  // namespace folio::app

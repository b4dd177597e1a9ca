#include "folio/dist/weight_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include <openssl/evp.h>

#include "folio/base/log.h"

namespace folio::dist {
namespace {

constexpr std::string_view kHashPrefix = "sha256:";
constexpr size_t kReadChunkBytes = size_t{4} << 20;

std::string errno_text() {
  return std::strerror(errno);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string hex_of(const std::array<uint8_t, 32>& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(digest.size() * 2);
  for (const uint8_t byte : digest) {
    text.push_back(kDigits[byte >> 4]);
    text.push_back(kDigits[byte & 15]);
  }
  return text;
}

// Writes all of `bytes` to `descriptor`, resuming after short writes and EINTR.
bool write_all(int descriptor, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(descriptor, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes = bytes.subspan(static_cast<size_t>(written));
  }
  return true;
}

// Reads up to destination.size() bytes; returns the count read (less only at the end of the
// file), or -1 on an error.
int64_t read_all(int descriptor, std::span<std::byte> destination) {
  size_t done = 0;
  while (done < destination.size()) {
    const ssize_t got = ::read(descriptor, destination.data() + done, destination.size() - done);
    if (got < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return static_cast<int64_t>(done);
}

}  // namespace

struct ContentHasher::State {
  EVP_MD_CTX* context = nullptr;
};

ContentHasher::ContentHasher() : state_(std::make_unique<State>()) {
  state_->context = EVP_MD_CTX_new();
  FOLIO_CHECK(state_->context != nullptr, "OpenSSL could not allocate a digest context");
  FOLIO_CHECK(EVP_DigestInit_ex(state_->context, EVP_sha256(), nullptr) == 1,
              "OpenSSL could not start a SHA-256 digest");
}

ContentHasher::~ContentHasher() {
  EVP_MD_CTX_free(state_->context);
}

void ContentHasher::update(std::span<const std::byte> bytes) {
  if (bytes.empty()) return;
  FOLIO_CHECK(EVP_DigestUpdate(state_->context, bytes.data(), bytes.size()) == 1);
}

ContentHash ContentHasher::finish() {
  ContentHash hash;
  unsigned int length = 0;
  FOLIO_CHECK(EVP_DigestFinal_ex(state_->context, hash.digest.data(), &length) == 1 &&
              length == hash.digest.size());
  return hash;
}

ContentHash ContentHash::of(std::span<const std::byte> bytes) {
  ContentHasher hasher;
  hasher.update(bytes);
  return hasher.finish();
}

Result<ContentHash> ContentHash::parse(std::string_view text) {
  ContentHash hash;
  if (!text.starts_with(kHashPrefix) ||
      text.size() != kHashPrefix.size() + 2 * hash.digest.size()) {
    return invalid_argument("content hash '{}' is not sha256:<64 hex digits>", text);
  }
  const std::string_view hex = text.substr(kHashPrefix.size());
  for (size_t i = 0; i < hash.digest.size(); ++i) {
    const int high = hex_value(hex[2 * i]);
    const int low = hex_value(hex[2 * i + 1]);
    if (high < 0 || low < 0) {
      return invalid_argument("content hash '{}' is not sha256:<64 hex digits>", text);
    }
    hash.digest[i] = static_cast<uint8_t>(high * 16 + low);
  }
  return hash;
}

std::string ContentHash::to_string() const {
  return fmt::format("{}{}", kHashPrefix, hex_of(digest));
}

Result<std::unique_ptr<WeightCache>> WeightCache::open(const std::string& directory) {
  if (directory.empty()) {
    return invalid_argument("the weight cache needs a directory (--cache-dir DIR)");
  }
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(directory) / "tmp", error);
  if (error) {
    return unavailable(
        "cannot create the weight cache directory {}: {}: choose another with "
        "--cache-dir",
        directory, error.message());
  }
  // Whatever a process that died while writing left behind: no entry refers to it.
  for (const auto& leftover :
       std::filesystem::directory_iterator(std::filesystem::path(directory) / "tmp", error)) {
    std::error_code ignored;
    if (leftover.path().extension() == ".part") std::filesystem::remove(leftover.path(), ignored);
  }
  auto cache = std::unique_ptr<WeightCache>(new WeightCache(directory));
  // Fail now, not at the first fetch, when the directory cannot be written.
  FOLIO_ASSIGN_OR_RETURN(auto temporary, cache->create_temporary());
  ::close(temporary.second);
  ::unlink(temporary.first.c_str());
  return cache;
}

std::string WeightCache::entry_path(const ContentHash& hash) const {
  return fmt::format("{}/sha256-{}.tensor", directory_, hex_of(hash.digest));
}

bool WeightCache::contains(const ContentHash& hash) const {
  struct stat info {};
  return ::stat(entry_path(hash).c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

void WeightCache::remove(const ContentHash& hash) const {
  ::unlink(entry_path(hash).c_str());
}

Result<int64_t> WeightCache::verify(const ContentHash& hash) const {
  const std::string path = entry_path(hash);
  const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) {
    if (errno == ENOENT) return not_found("weight cache entry {} is absent", hash.to_string());
    return unavailable("cannot read weight cache entry {}: {}", path, errno_text());
  }
  ContentHasher hasher;
  std::vector<std::byte> buffer(kReadChunkBytes);
  int64_t total = 0;
  for (;;) {
    const int64_t got = read_all(descriptor, buffer);
    if (got < 0) {
      const std::string reason = errno_text();
      ::close(descriptor);
      return unavailable("cannot read weight cache entry {}: {}", path, reason);
    }
    hasher.update(std::span<const std::byte>(buffer.data(), static_cast<size_t>(got)));
    total += got;
    if (got < static_cast<int64_t>(buffer.size())) break;
  }
  ::close(descriptor);
  const ContentHash found = hasher.finish();
  if (found != hash) {
    remove(hash);
    return data_loss(
        "weight cache entry {} is corrupted (its {} bytes hash to {}); it was "
        "deleted and must be fetched again",
        path, total, found.to_string());
  }
  return total;
}

Status WeightCache::read(const ContentHash& hash, std::span<std::byte> destination) const {
  const std::string path = entry_path(hash);
  const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) {
    if (errno == ENOENT) return not_found("weight cache entry {} is absent", hash.to_string());
    return unavailable("cannot read weight cache entry {}: {}", path, errno_text());
  }
  const int64_t got = read_all(descriptor, destination);
  // One byte more than expected means the file is longer: corrupted too.
  std::byte extra{};
  const int64_t more = got == static_cast<int64_t>(destination.size())
                           ? read_all(descriptor, std::span<std::byte>(&extra, 1))
                           : 0;
  const std::string reason = errno_text();
  ::close(descriptor);
  if (got < 0 || more < 0)
    return unavailable("cannot read weight cache entry {}: {}", path, reason);
  if (got != static_cast<int64_t>(destination.size()) || more != 0) {
    remove(hash);
    return data_loss(
        "weight cache entry {} is corrupted (it is not {} bytes long); it was "
        "deleted and must be fetched again",
        path, destination.size());
  }
  const ContentHash found = ContentHash::of(destination);
  if (found != hash) {
    remove(hash);
    return data_loss(
        "weight cache entry {} is corrupted (its bytes hash to {}); it was deleted "
        "and must be fetched again",
        path, found.to_string());
  }
  return Status();
}

Result<std::pair<std::string, int>> WeightCache::create_temporary() const {
  std::random_device device;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string path =
        fmt::format("{}/tmp/{:08x}{:08x}.part", directory_, device(), device());
    const int descriptor = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (descriptor >= 0) return std::make_pair(path, descriptor);
    if (errno != EEXIST) {
      return unavailable(
          "cannot write in the weight cache directory {}: {}: check its "
          "permissions and free space, or choose another with --cache-dir",
          directory_, errno_text());
    }
  }
  return unavailable("cannot create a temporary file in {}/tmp", directory_);
}

Result<std::unique_ptr<WeightCache::Writer>> WeightCache::begin(const ContentHash& hash,
                                                                int64_t expected_bytes) const {
  if (expected_bytes < 0) {
    return invalid_argument("weight cache entry {} of {} bytes", hash.to_string(), expected_bytes);
  }
  FOLIO_ASSIGN_OR_RETURN(auto temporary, create_temporary());
  return std::unique_ptr<Writer>(new Writer(entry_path(hash), std::move(temporary.first),
                                            temporary.second, hash, expected_bytes));
}

Status WeightCache::put(const ContentHash& hash, std::span<const std::byte> bytes) const {
  FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<Writer> writer,
                         begin(hash, static_cast<int64_t>(bytes.size())));
  FOLIO_RETURN_IF_ERROR(writer->append(bytes));
  return writer->commit();
}

WeightCache::Writer::Writer(std::string entry_path, std::string temporary_path, int descriptor,
                            ContentHash hash, int64_t expected_bytes)
    : entry_path_(std::move(entry_path)),
      temporary_path_(std::move(temporary_path)),
      descriptor_(descriptor),
      hash_(hash),
      expected_bytes_(expected_bytes) {}

WeightCache::Writer::~Writer() {
  if (descriptor_ >= 0) ::close(descriptor_);
  if (!committed_) ::unlink(temporary_path_.c_str());
}

Status WeightCache::Writer::append(std::span<const std::byte> bytes) {
  if (descriptor_ < 0 || committed_) {
    return failed_precondition("weight cache entry {} is already closed", hash_.to_string());
  }
  if (bytes_written_ + static_cast<int64_t>(bytes.size()) > expected_bytes_) {
    return invalid_argument("weight cache entry {} gets more than its {} bytes", hash_.to_string(),
                            expected_bytes_);
  }
  if (!write_all(descriptor_, bytes)) {
    return unavailable(
        "cannot write {}: {}: check the free space of the weight cache's file "
        "system",
        temporary_path_, errno_text());
  }
  hasher_.update(bytes);
  bytes_written_ += static_cast<int64_t>(bytes.size());
  return Status();
}

Status WeightCache::Writer::commit() {
  if (descriptor_ < 0 || committed_) {
    return failed_precondition("weight cache entry {} is already closed", hash_.to_string());
  }
  const int descriptor = descriptor_;
  descriptor_ = -1;
  if (bytes_written_ != expected_bytes_) {
    ::close(descriptor);
    return invalid_argument("weight cache entry {} got {} bytes, expected {}", hash_.to_string(),
                            bytes_written_, expected_bytes_);
  }
  const ContentHash found = hasher_.finish();
  if (found != hash_) {
    ::close(descriptor);
    return invalid_argument("refusing the bytes for weight cache entry {}: they hash to {}",
                            hash_.to_string(), found.to_string());
  }
  // Flushed before the rename, so the name never points at bytes still in flight.
  const bool synced = ::fsync(descriptor) == 0;
  const std::string sync_reason = errno_text();
  ::close(descriptor);
  if (!synced) return unavailable("cannot flush {}: {}", temporary_path_, sync_reason);
  if (::rename(temporary_path_.c_str(), entry_path_.c_str()) != 0) {
    return unavailable("cannot rename {} to {}: {}", temporary_path_, entry_path_, errno_text());
  }
  committed_ = true;
  return Status();
}

}  // namespace folio::dist

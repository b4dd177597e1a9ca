#include "folio/gguf/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace folio::gguf {

Result<MappedFile> MappedFile::open(const std::string& path) {
  const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) return errno_status("open", fmt::format("opening '{}'", path));
  struct stat info {};
  if (::fstat(descriptor, &info) != 0) {
    Status status = errno_status("fstat", fmt::format("reading the size of '{}'", path));
    ::close(descriptor);
    return status;
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(descriptor);
    return invalid_argument("'{}' is not a regular file", path);
  }
  if (info.st_size == 0) {
    ::close(descriptor);
    return invalid_argument("'{}' is empty", path);
  }
  const auto size = static_cast<size_t>(info.st_size);
  void* address = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, descriptor, 0);
  // The mapping keeps its own reference to the file; the descriptor is no longer needed.
  const int saved_errno = errno;
  ::close(descriptor);
  if (address == MAP_FAILED) {
    errno = saved_errno;
    return errno_status("mmap", fmt::format("mapping '{}' ({} bytes)", path, size));
  }
  return MappedFile(path, static_cast<const uint8_t*>(address), size);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  unmap();
}

void MappedFile::drop_resident_pages(uint64_t offset, uint64_t size) const {
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = (offset + page - 1) / page * page;
  const uint64_t end = std::min<uint64_t>(offset + size, size_) / page * page;
  if (data_ == nullptr || begin >= end) return;
  // Advice only: a failure leaves the pages resident, which costs memory, never correctness.
  ::madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_DONTNEED);
}

void MappedFile::unmap() {
  if (data_ != nullptr) {
    const int result = ::munmap(const_cast<uint8_t*>(data_), size_);
    FOLIO_CHECK(result == 0, "munmap of '{}' failed", path_);
    data_ = nullptr;
    size_ = 0;
  }
}

}  // namespace folio::gguf

// MappedFile: a whole file mapped read-only into memory (mmap, MAP_PRIVATE, PROT_READ), so GGUF
// weights are used in place and paged in by the kernel on first touch.
//
// A mapping reflects the file as it is on disk: if another process truncates the file while it
// is mapped, touching the lost pages raises SIGBUS. That is outside what a reader can check;
// Folio never writes to a file it has mapped.
//
// Thread-safety: immutable after open(); the bytes may be read from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "folio/base/result.h"

namespace folio::gguf {

class MappedFile {
 public:
  // Errors: kNotFound when the file does not exist, kInvalidArgument for a directory or an empty
  // file, errno-derived codes when open/fstat/mmap fail.
  static Result<MappedFile> open(const std::string& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

  // Drops the resident pages wholly inside [offset, offset + size) (madvise MADV_DONTNEED):
  // memory the process no longer counts, re-read from the file if touched again, so the bytes
  // seen never change. For data kept in another form (weights repacked at load).
  void drop_resident_pages(uint64_t offset, uint64_t size) const;

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  void unmap();

  std::string path_;
  const uint8_t* data_ = nullptr;  // nullptr after a move
  size_t size_ = 0;
};

}  // namespace folio::gguf

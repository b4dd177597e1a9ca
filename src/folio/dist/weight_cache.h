// WeightCache: a worker's local store of model tensors (issue 15, slice 5: the weight cache),
// a directory of entries each holding one tensor's bytes, keyed by their content hash.
//
// Terms:
// - Content hash: SHA-256 of the tensor's bytes (OpenSSL's libcrypto, which gRPC already
//   needs), written "sha256:<64 hex digits>". It names the bytes, not the tensor: two models
//   that share a tensor share its entry, and a changed tensor is a new entry.
// - Entry: the file DIR/sha256-<hex>.tensor holding exactly the bytes. Temporary files are
//   DIR/tmp/<random>.part until renamed into place.
//
// Invariants:
// - An entry's file is complete or absent: writes go to a temporary file, are flushed
//   (fsync) and renamed over the entry's name (atomic on one file system), so a crash or a
//   failed write never leaves a partial entry under its name.
// - Nothing is served unverified: every read hashes what it read and compares it with the key;
//   on a mismatch (a corrupted or truncated file) the entry is deleted and the read returns
//   kDataLoss naming it, so the caller fetches it again.
// - Bad input never changes what is stored: put() and the Writer hash what they are given and
//   refuse (kInvalidArgument, nothing stored) bytes whose hash is not the declared key.
//
// Thread-safety: every method may be called from any thread, and several processes may share
// a directory: writers of one entry each write their own temporary file and the last rename
// wins (the same bytes); a reader sees a whole entry or none. The object holds no mutable state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "folio/base/result.h"

namespace folio::dist {

struct ContentHash {
  std::array<uint8_t, 32> digest{};  // SHA-256

  // The hash of `bytes`.
  static ContentHash of(std::span<const std::byte> bytes);
  // From "sha256:<64 hex digits>"; kInvalidArgument naming the text otherwise.
  static Result<ContentHash> parse(std::string_view text);
  std::string to_string() const;  // "sha256:<64 lowercase hex digits>"

  friend bool operator==(const ContentHash&, const ContentHash&) = default;
  friend auto operator<=>(const ContentHash&, const ContentHash&) = default;
};

// Hashes bytes given in pieces (a tensor streamed in chunks). Not thread-safe.
class ContentHasher {
 public:
  ContentHasher();
  ~ContentHasher();
  ContentHasher(const ContentHasher&) = delete;
  ContentHasher& operator=(const ContentHasher&) = delete;

  void update(std::span<const std::byte> bytes);
  // The hash of every byte given since construction. Requires: called once.
  ContentHash finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

class WeightCache {
 public:
  // Opens (creating it and its tmp/ folder when absent) the cache in `directory`. Temporary
  // files left by a process that died are removed. kInvalidArgument for an empty path;
  // kUnavailable naming the directory and the OS's reason when it cannot be created or written.
  static Result<std::unique_ptr<WeightCache>> open(const std::string& directory);

  const std::string& directory() const { return directory_; }
  std::string entry_path(const ContentHash& hash) const;

  // Whether an entry's file exists (not verified).
  bool contains(const ContentHash& hash) const;
  // Reads the entry and checks its hash: its size when it is sound; kNotFound when absent;
  // kDataLoss (the entry deleted) when its bytes do not hash to `hash`.
  Result<int64_t> verify(const ContentHash& hash) const;
  // Reads the entry into `destination`, which must be exactly its size, and checks the hash:
  // kNotFound when absent; kDataLoss (the entry deleted) for another size or another hash.
  Status read(const ContentHash& hash, std::span<std::byte> destination) const;
  // Stores `bytes` as the entry `hash`: kInvalidArgument, nothing stored, when they hash to
  // something else; kUnavailable when the file system refuses (naming the path and reason).
  // Storing an entry that exists replaces it with the same bytes.
  Status put(const ContentHash& hash, std::span<const std::byte> bytes) const;
  // Deletes the entry if present.
  void remove(const ContentHash& hash) const;

  // One entry written in pieces (a tensor arriving over a stream): append(), then commit(),
  // which checks the hash and the size and renames the file into place. Destroyed without a
  // successful commit, it deletes its temporary file. Not thread-safe; one per entry.
  class Writer {
   public:
    ~Writer();
    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;

    Status append(std::span<const std::byte> bytes);
    int64_t bytes_written() const { return bytes_written_; }
    // kInvalidArgument (nothing stored) when the bytes are not `expected_bytes` long or do not
    // hash to the key; the file system's errors as kUnavailable.
    Status commit();

   private:
    friend class WeightCache;
    Writer(std::string entry_path, std::string temporary_path, int descriptor, ContentHash hash,
           int64_t expected_bytes);
    std::string entry_path_;
    std::string temporary_path_;
    int descriptor_ = -1;  // -1 once closed
    ContentHash hash_;
    int64_t expected_bytes_ = 0;
    int64_t bytes_written_ = 0;
    ContentHasher hasher_;
    bool committed_ = false;
  };
  // Starts writing the entry `hash` of `expected_bytes` bytes.
  Result<std::unique_ptr<Writer>> begin(const ContentHash& hash, int64_t expected_bytes) const;

 private:
  explicit WeightCache(std::string directory) : directory_(std::move(directory)) {}
  Result<std::pair<std::string, int>> create_temporary() const;

  std::string directory_;
};

}  // namespace folio::dist

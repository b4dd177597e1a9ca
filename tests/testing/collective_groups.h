// Groups of Collectives members for the dist tests and benchmarks: an in-process group, a gloo
// group whose members are threads of this process over loopback, a temporary rendezvous
// directory, and run_on_ranks (one thread per member, joined before it returns).
#pragma once

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "folio/base/check.h"
#include "folio/base/result.h"
#include "folio/dist/collectives.h"
#include "folio/dist/gloo_collectives.h"
#include "folio/dist/in_process_collectives.h"

namespace folio::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at the end.
class TemporaryDirectory {
 public:
  TemporaryDirectory() {
    const char* base = getenv("TMPDIR");
    std::string pattern = (std::filesystem::path(base != nullptr && *base != '\0' ? base : "/tmp") /
                           "folio-dist-XXXXXX")
                              .string();
    FOLIO_CHECK(mkdtemp(pattern.data()) != nullptr, "mkdtemp {} failed", pattern);
    path_ = pattern;
  }
  ~TemporaryDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

using Members = std::vector<std::unique_ptr<dist::Collectives>>;

// Runs body(rank) on one thread per rank and joins them all.
inline void run_on_ranks(int size, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int rank = 0; rank < size; ++rank) threads.emplace_back(body, rank);
  for (std::thread& thread : threads) thread.join();
}

inline dist::GlooGroupOptions gloo_options(const std::string& directory, int rank, int size,
                                           std::chrono::milliseconds timeout,
                                           const std::string& group_id = "test",
                                           uint64_t epoch = 0) {
  return dist::GlooGroupOptions{.rank = rank,
                                .size = size,
                                .store_directory = directory,
                                .store_address = {},
                                .group_id = group_id,
                                .epoch = epoch,
                                .host = "127.0.0.1",
                                .timeout = timeout};
}

// Every member of a gloo group, each connected by its own thread (connecting blocks until all
// have joined). Returns the first error when a member fails to join.
inline Result<Members> make_gloo_group_in_threads(const std::string& directory, int size,
                                                  std::chrono::milliseconds timeout,
                                                  const std::string& group_id = "test",
                                                  uint64_t epoch = 0) {
  Members members(size);
  std::vector<Status> outcomes(size);
  run_on_ranks(size, [&](int rank) {
    auto member =
        dist::connect_gloo_group(gloo_options(directory, rank, size, timeout, group_id, epoch));
    if (member.ok()) {
      members[rank] = std::move(member).value();
    } else {
      outcomes[rank] = member.status();
    }
  });
  for (const Status& outcome : outcomes) {
    if (!outcome.ok()) return outcome;
  }
  return members;
}

}  // namespace folio::testing

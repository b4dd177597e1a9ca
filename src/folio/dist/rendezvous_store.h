// The rendezvous store served over gRPC (protocol revision 9): the key-value store a worker
// group's members meet in while forming their gloo group, held in memory by member 0's worker
// and reached through the worker service's StoreSet / StoreWait calls, so the members need no
// shared file system (dist.md "Gloo backend").
//
// RendezvousStore is the worker's side: scopes of (group id, epoch), each a map of keys to
// values. A wait is served on the worker: the call blocks until every key is present, its own
// timeout passes or the store closes. One call per wait instead of polling, and a member wakes
// as soon as the last key is set. Scopes of epochs older than the worker's are dropped
// (drop_before, called when the worker prepares or fences a stage in a newer epoch); close()
// ends every wait when the worker exits.
//
// RendezvousStoreClient is a member's side: one channel to member 0's worker; every call has a
// deadline (a wait's timeout plus a margin for the round trip), and its errors name the worker:
// kUnavailable when it cannot be reached, kDeadlineExceeded naming the keys still missing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "folio/base/mutex.h"
#include "folio/base/result.h"

namespace folio::dist {

class RendezvousStore {
 public:
  // Bounds on what one scope holds (a group's rendezvous needs a few keys of a few hundred
  // bytes per member): a client that writes more is refused rather than filling the worker.
  static constexpr size_t kMaxKeysPerScope = 4096;
  static constexpr size_t kMaxValueBytes = size_t{1} << 20;

  // kAlreadyExists when the key is set already (a group is formed once per epoch);
  // kResourceExhausted past the bounds above; kUnavailable once closed; kFailedPrecondition for
  // an epoch dropped already.
  Status set(const std::string& group_id, uint64_t epoch, const std::string& key,
             std::string value);

  // The keys' values once every key is present; kDeadlineExceeded naming the missing keys when
  // `timeout` passes first (0: only checks), kUnavailable when the store closes meanwhile.
  Result<std::vector<std::string>> wait(const std::string& group_id, uint64_t epoch,
                                        const std::vector<std::string>& keys,
                                        std::chrono::milliseconds timeout);

  // Drops every scope of an epoch older than `epoch`; later calls for such an epoch are refused
  // (kFailedPrecondition), so a late member of a superseded group cannot bring its scope back.
  void drop_before(uint64_t epoch);
  // Ends every wait (kUnavailable) and refuses every later call.
  void close();

  // The number of scopes held (tests).
  size_t num_scopes() const;

 private:
  using Scope = std::map<std::string, std::string>;
  Status check_epoch(const std::string& group_id, uint64_t epoch) const FOLIO_REQUIRES(mutex_);
  mutable Mutex mutex_;
  std::condition_variable changed_;
  std::map<std::pair<std::string, uint64_t>, Scope> scopes_ FOLIO_GUARDED_BY(mutex_);
  bool closed_ FOLIO_GUARDED_BY(mutex_) = false;
  uint64_t oldest_epoch_ FOLIO_GUARDED_BY(mutex_) = 0;
};

class RendezvousStoreClient {
 public:
  // A client of the store of `address` (member 0's worker, HOST:PORT), scoped to the group and
  // epoch. Connects lazily, on the first call.
  RendezvousStoreClient(std::string address, std::string group_id, uint64_t epoch);
  ~RendezvousStoreClient();
  RendezvousStoreClient(const RendezvousStoreClient&) = delete;
  RendezvousStoreClient& operator=(const RendezvousStoreClient&) = delete;

  const std::string& address() const;

  // Bounded by `timeout`.
  Status set(const std::string& key, const std::string& value, std::chrono::milliseconds timeout);
  // The values of `keys` once all are set, waiting up to `timeout` on the worker.
  Result<std::vector<std::string>> wait(const std::vector<std::string>& keys,
                                        std::chrono::milliseconds timeout, bool want_values);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace folio::dist

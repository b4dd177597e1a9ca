// KvPageSource: the narrow interface the KV cache needs from page memory.
//
// The KV cache grows and shrinks by whole pages taken from, and given back to, the one memory
// budget (the page pool, memory/), so KV cache, adapters and graph memory compete for the same
// bytes. A page holds a whole number of KV blocks. The block manager keeps a page *pinned* while
// any block in it is OWNED (referenced by a sequence) and unpinned while all its blocks are FREE
// or CACHED; the source may then take an unpinned page back (evict it) when it needs memory, and
// tells the cache first through KvEvictionHandler so the cache forgets the page's blocks.
//
// Terms:
// - page_index: the page's physical index in the source's address range; the page's bytes are
//   [base() + page_index * page_bytes(), + page_bytes()). Block ids are derived from it.
// - handle: an opaque token for one tenure of a page (the source may fold a generation into it),
//   so a handle that outlived an eviction is recognisably stale.
//
// Contract for implementations:
// - allocate_page() returns a page that is pinned; kResourceExhausted when the budget is spent
//   (after evicting whatever the source is willing to evict).
// - pin() fails with kFailedPrecondition once the source has decided to evict the page (or has
//   evicted it); the decision to evict and pin() are mutually exclusive.
// - Before an evicted page's bytes are reused, and before its index can be handed out again,
//   the source calls on_kv_page_evicted(page) on the registered handler. The call may come from
//   any thread, and from inside allocate_page() on the cache's own thread.
// - release_page() takes back a page the cache holds, pinned or not; a stale handle is
//   kFailedPrecondition and changes nothing.
//
// Thread-safety: implementations are safe to call from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "folio/base/result.h"
#include "folio/base/status.h"
#include "folio/base/strong_id.h"

namespace folio::kv {

struct KvPageHandleTag {};
using KvPageHandle = StrongId<KvPageHandleTag, uint64_t>;

struct KvPage {
  KvPageHandle handle;
  int32_t page_index = -1;
  std::byte* address = nullptr;  // == base() + page_index * page_bytes()
};

// Implemented by the KV cache. Called by the source, on any thread, with the page already marked
// so that pin() fails; the handler must not call back into the source.
class KvEvictionHandler {
 public:
  virtual void on_kv_page_evicted(const KvPage& page) = 0;

 protected:
  ~KvEvictionHandler() = default;
};

class KvPageSource {
 public:
  virtual ~KvPageSource() = default;

  virtual int64_t page_bytes() const = 0;
  // Start of page 0. Stable for the source's lifetime.
  virtual std::byte* base() const = 0;
  // Page indices lie in [0, capacity_pages()): the whole budget, shared with other owners.
  virtual int32_t capacity_pages() const = 0;
  // Most pages the KV cache may hold at once (a cap within the budget); capacity_pages() when
  // the source sets none. Admission sizes itself by this, addressing by capacity_pages().
  virtual int32_t max_pages_held() const { return capacity_pages(); }
  // Pages allocate_page() could return now without evicting KV pages. A hint: other threads
  // may change it at any time.
  virtual int32_t num_pages_available() const = 0;

  virtual Result<KvPage> allocate_page() = 0;
  virtual Status release_page(const KvPage& page) = 0;
  virtual Status pin(const KvPage& page) = 0;
  // Requires: the page is pinned by the caller and its handle is current.
  virtual void unpin(const KvPage& page) = 0;

  // nullptr unregisters. The handler must outlive its registration.
  virtual void set_eviction_handler(KvEvictionHandler* handler) = 0;
};

}  // namespace folio::kv

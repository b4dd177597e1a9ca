// IndexList: an intrusive doubly linked list of integer nodes whose links live in an array the
// caller owns (one IndexLinks per node), so membership changes are O(1) and allocation-free.
// A node is in at most one list that shares its links array at a time.
//
// remove() returns the node's Position (its neighbours); restore() puts a removed node back at
// that position. Undoing a sequence of list operations in reverse order with restore() and
// remove() rebuilds the lists exactly, which is how the block allocator rolls back (see
// block_allocator.h).
//
// Thread-safety: none; the owner serializes access.
#pragma once

#include <cstdint>
#include <vector>

#include "folio/base/check.h"

namespace folio::kv {

struct IndexLinks {
  int32_t previous = -1;
  int32_t next = -1;
};

class IndexList {
 public:
  struct Position {
    int32_t previous = -1;
    int32_t next = -1;
  };

  // `links` must outlive the list and never be resized while the list is in use.
  explicit IndexList(std::vector<IndexLinks>* links = nullptr) : links_(links) {}

  int32_t front() const { return head_; }
  int32_t back() const { return tail_; }
  int32_t next(int32_t node) const { return (*links_)[node].next; }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  void push_back(int32_t node) { restore(node, Position{tail_, -1}); }
  void push_front(int32_t node) { restore(node, Position{-1, head_}); }

  Position remove(int32_t node) {
    IndexLinks& link = (*links_)[node];
    const Position position{link.previous, link.next};
    if (link.previous >= 0) {
      (*links_)[link.previous].next = link.next;
    } else {
      FOLIO_DCHECK(head_ == node);
      head_ = link.next;
    }
    if (link.next >= 0) {
      (*links_)[link.next].previous = link.previous;
    } else {
      FOLIO_DCHECK(tail_ == node);
      tail_ = link.previous;
    }
    link = IndexLinks{};
    --size_;
    return position;
  }

  // Requires: position.previous and position.next are adjacent in this list (or the list's
  // ends), i.e. the list is as it was right after the remove() that returned `position`.
  void restore(int32_t node, Position position) {
    FOLIO_DCHECK(position.previous < 0 ? head_ == position.next
                                       : (*links_)[position.previous].next == position.next);
    IndexLinks& link = (*links_)[node];
    link.previous = position.previous;
    link.next = position.next;
    if (position.previous >= 0) {
      (*links_)[position.previous].next = node;
    } else {
      head_ = node;
    }
    if (position.next >= 0) {
      (*links_)[position.next].previous = node;
    } else {
      tail_ = node;
    }
    ++size_;
  }

 private:
  std::vector<IndexLinks>* links_;
  int32_t head_ = -1;
  int32_t tail_ = -1;
  int64_t size_ = 0;
};

}  // namespace folio::kv

#include "folio/memory/eviction_index.h"

#include <bit>
#include <limits>

namespace folio::memory {

EvictionIndex::EvictionIndex(PageTable& table, EvictionWeights weights,
                             std::array<int, kNumContentTypes> content_priority)
    : table_(table), weights_(weights), content_priority_(content_priority) {}

int EvictionIndex::size_class_of(uint32_t pages) {
  FOLIO_DCHECK(pages > 0);
  return std::bit_width(pages) - 1;
}

EvictionIndex::Heap& EvictionIndex::heap_of(uint32_t head) {
  const PageSlot& slot = table_[head];
  const int content = slot.content.load(std::memory_order_relaxed);
  return heaps_[content][size_class_of(slot.allocation_pages.load(std::memory_order_relaxed))];
}

bool EvictionIndex::before(uint32_t a, uint32_t b) const {
  const uint64_t key_a = table_[a].heap_key;
  const uint64_t key_b = table_[b].heap_key;
  return key_a < key_b || (key_a == key_b && a < b);
}

void EvictionIndex::place(Heap& heap, size_t position, uint32_t head) {
  heap[position] = head;
  table_[head].heap_position = static_cast<uint32_t>(position);
}

void EvictionIndex::sift_up(Heap& heap, size_t position) {
  const uint32_t head = heap[position];
  while (position > 0) {
    const size_t parent = (position - 1) / 2;
    if (!before(head, heap[parent])) break;
    place(heap, position, heap[parent]);
    position = parent;
  }
  place(heap, position, head);
}

void EvictionIndex::sift_down(Heap& heap, size_t position) {
  const uint32_t head = heap[position];
  const size_t count = heap.size();
  while (true) {
    size_t child = 2 * position + 1;
    if (child >= count) break;
    if (child + 1 < count && before(heap[child + 1], heap[child])) ++child;
    if (!before(heap[child], head)) break;
    place(heap, position, heap[child]);
    position = child;
  }
  place(heap, position, head);
}

void EvictionIndex::remove_at(Heap& heap, size_t position) {
  const uint32_t removed = heap[position];
  const uint32_t last = heap.back();
  heap.pop_back();
  table_[removed].heap_position = kNoPage;
  --size_;
  if (position == heap.size()) return;
  place(heap, position, last);
  sift_down(heap, position);
  sift_up(heap, table_[last].heap_position);
}

void EvictionIndex::link(uint32_t head) {
  PageSlot& slot = table_[head];
  FOLIO_DCHECK(slot.heap_position == kNoPage, "page {} is already in the eviction index", head);
  slot.heap_key = slot.last_use.load(std::memory_order_relaxed);
  const int content = slot.content.load(std::memory_order_relaxed);
  const int size_class = size_class_of(slot.allocation_pages.load(std::memory_order_relaxed));
  Heap& heap = heaps_[content][size_class];
  heap.push_back(head);
  ++size_;
  nonempty_[content] |= uint32_t{1} << size_class;
  sift_up(heap, heap.size() - 1);
}

void EvictionIndex::remove(uint32_t head) {
  const uint32_t position = table_[head].heap_position;
  FOLIO_DCHECK(position != kNoPage, "page {} is not in the eviction index", head);
  Heap& heap = heap_of(head);
  remove_at(heap, position);
  if (heap.empty()) {
    const PageSlot& slot = table_[head];
    nonempty_[slot.content.load(std::memory_order_relaxed)] &=
        ~(uint32_t{1} << size_class_of(slot.allocation_pages.load(std::memory_order_relaxed)));
  }
}

uint32_t EvictionIndex::repaired_top(int content, int size_class) {
  Heap& heap = heaps_[content][size_class];
  while (!heap.empty()) {
    const uint32_t head = heap.front();
    PageSlot& slot = table_[head];
    // Acquire pairs with the release of the pin, unpin or free that wrote this word, so the
    // last_use an unpin stored before its CAS is visible below.
    uint64_t bits = slot.word.load(std::memory_order_acquire);
    const PageWord word(bits);
    FOLIO_DCHECK(word.linked(), "indexed page {} has no linked bit", head);
    if (word.state() != PageState::kUnpinned) {
      // Pinned (or being freed): drop it. The CAS fails if a lock-free unpin changed the word
      // meanwhile; then look at the entry again. acq_rel: a read-modify-write in the word's
      // release sequence; the bit itself is guarded by the index mutex.
      if (!slot.word.compare_exchange_strong(bits, word.with_linked(false).bits(),
                                             std::memory_order_acq_rel)) {
        continue;
      }
      remove_at(heap, 0);
      continue;
    }
    const uint64_t last_use = slot.last_use.load(std::memory_order_relaxed);
    if (last_use > slot.heap_key) {
      slot.heap_key = last_use;
      sift_down(heap, 0);
      continue;
    }
    return head;
  }
  nonempty_[content] &= ~(uint32_t{1} << size_class);
  return kNoPage;
}

uint32_t EvictionIndex::select_victim(uint64_t now) {
  uint32_t best = kNoPage;
  double best_score = std::numeric_limits<double>::infinity();
  uint64_t best_last_use = 0;
  for (int content = 0; content < kNumContentTypes; ++content) {
    uint32_t classes = nonempty_[content];
    while (classes != 0) {
      const int size_class = std::countr_zero(classes);
      classes &= classes - 1;
      const uint32_t head = repaired_top(content, size_class);
      if (head == kNoPage) continue;
      const PageSlot& slot = table_[head];
      const double value =
          score(slot.heap_key, slot.allocation_pages.load(std::memory_order_relaxed),
                static_cast<ContentType>(content), now);
      // Ties go to the older allocation, then the lower page, so the choice is deterministic.
      if (value < best_score ||
          (value == best_score &&
           (slot.heap_key < best_last_use || (slot.heap_key == best_last_use && head < best)))) {
        best = head;
        best_score = value;
        best_last_use = slot.heap_key;
      }
    }
  }
  return best;
}

double EvictionIndex::score(uint64_t last_use, uint32_t pages, ContentType content,
                            uint64_t now) const {
  const double age = now > last_use ? static_cast<double>(now - last_use) : 0.0;
  return weights_.recency / (age + 1.0) +
         weights_.size * static_cast<double>(pages) / static_cast<double>(table_.num_pages()) +
         weights_.priority * content_priority_[content_index(content)];
}

double EvictionIndex::size_class_slack(uint32_t pages) const {
  const uint32_t class_width = uint32_t{1} << size_class_of(pages);
  return weights_.size * static_cast<double>(class_width) / static_cast<double>(table_.num_pages());
}

uint32_t EvictionIndex::check_invariants() const {
  uint32_t entries = 0;
  for (int content = 0; content < kNumContentTypes; ++content) {
    for (int size_class = 0; size_class < kNumSizeClasses; ++size_class) {
      const Heap& heap = heaps_[content][size_class];
      const bool marked = (nonempty_[content] >> size_class) & 1;
      // A marked class may be empty only transiently (repaired_top clears it); never the reverse.
      FOLIO_CHECK(marked || heap.empty(), "class ({}, {}) holds entries but is unmarked", content,
                  size_class);
      for (size_t position = 0; position < heap.size(); ++position) {
        const uint32_t head = heap[position];
        const PageSlot& slot = table_[head];
        FOLIO_CHECK(slot.heap_position == position, "page {}: heap position {} != {}", head,
                    slot.heap_position, position);
        FOLIO_CHECK(
            slot.content.load(std::memory_order_relaxed) == content &&
                size_class_of(slot.allocation_pages.load(std::memory_order_relaxed)) == size_class,
            "page {} sits in the wrong class", head);
        FOLIO_CHECK(PageWord(slot.word.load(std::memory_order_acquire)).linked(),
                    "indexed page {} has no linked bit", head);
        FOLIO_CHECK(slot.heap_key <= slot.last_use.load(std::memory_order_relaxed),
                    "page {}: key {} is past its last use", head, slot.heap_key);
        if (position > 0) {
          FOLIO_CHECK(!before(head, heap[(position - 1) / 2]), "heap order broken at page {}",
                      head);
        }
        ++entries;
      }
    }
  }
  FOLIO_CHECK(entries == size_, "index counts {} entries, heaps hold {}", size_, entries);
  return entries;
}

}  // namespace folio::memory

// Bigram merging: the loop both tokenizer models run to turn a run of text into pieces. The text
// starts as a row of symbols (one character each, say); the best-ranked pair of adjacent symbols
// is merged into one symbol, which forms new pairs with its neighbours, and so on until no
// adjacent pair merges. The models differ only in the rule that ranks a pair:
//   SentencePiece: the score of the piece the pair concatenates to (higher first);
//   byte-level BPE: the rank of the merge (left, right) in the vocabulary's merge list.
// What becomes of the symbols left (piece lookup, byte fallback) is also the caller's.
//
// Terms:
//   symbol  a run of the text; a symbol merged into its left neighbour has length 0 and leaves
//           the doubly linked list of live symbols (indices, -1 at either end).
//   bigram  a candidate pair of adjacent symbols, queued with its rank and the pair's length.
//   rank    what the rule returns for a pair that may merge: lower merges first; equal ranks
//           merge the leftmost pair first (llama.cpp's order: it decides tokens).
//
// The queue is a heap of bigrams that may be stale: merging a symbol leaves the bigrams that
// named it in the heap, and they are discarded when popped. Symbols only grow, so a bigram is
// stale exactly when its two symbols' lengths no longer add up to the length it was queued with.
// Checking that on pop is cheaper than finding and removing the stale entries on every merge.
//
// Thread-safety: none; one BigramMerge per thread. It keeps its buffers from one text to the
// next, so encoding many short words allocates once.
//
// Invariants: the symbols added since start() lie in text order, each beginning where the
// previous one ends; during merge() the live symbols, walked by their links, still do.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "folio/base/check.h"

namespace folio::tokenizer {

// Rule: a callable (std::string_view left, std::string_view right) -> std::optional<Rank>,
// nullopt when the pair does not merge. left and right are adjacent in the text (right begins
// where left ends), so left.data() spans their concatenation for left.size() + right.size()
// bytes. Rank: compared with > and == (an integer, a float).
template <typename Rule>
class BigramMerge {
 public:
  using Rank =
      typename std::invoke_result_t<const Rule&, std::string_view, std::string_view>::value_type;

  explicit BigramMerge(Rule rule) : rule_(std::move(rule)) {}

  // Starts over on `text`, with no symbols yet.
  void start(std::string_view text) {
    text_ = text;
    symbols_.clear();
    heap_.clear();
    symbols_end_ = 0;
  }

  // Appends the symbol of the next `length` bytes of the text.
  // Requires: length > 0; the symbols added since start() plus this one fit in the text.
  void add_symbol(size_t length) {
    FOLIO_DCHECK(length > 0 && symbols_end_ + length <= text_.size());
    const int index = static_cast<int>(symbols_.size());
    // Linked to a next symbol that may never come: merge() unlinks the last one.
    symbols_.push_back({symbols_end_, length, index - 1, index + 1});
    symbols_end_ += length;
  }

  // Merges until no adjacent pair ranks, then calls visit(piece) for each symbol left, left to
  // right.
  // Requires: the symbols added since start() cover the whole text.
  template <typename Visit>
  void merge(Visit&& visit) {
    FOLIO_DCHECK(symbols_end_ == text_.size(), "symbols cover {} of {} bytes", symbols_end_,
                 text_.size());
    if (!symbols_.empty()) symbols_.back().next = -1;
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) try_add(i - 1, i);
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), HeapOrder());
      const Bigram bigram = heap_.back();
      heap_.pop_back();
      Symbol& left = symbols_[bigram.left];
      Symbol& right = symbols_[bigram.right];
      if (left.length == 0 || right.length == 0 || left.length + right.length != bigram.length) {
        continue;  // one side changed since this pair was queued
      }
      left.length += right.length;
      right.length = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].previous = bigram.left;
      try_add(left.previous, bigram.left);
      try_add(bigram.left, left.next);
    }
    for (int i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[i].next) {
      visit(piece(i));
    }
  }

 private:
  struct Symbol {
    size_t start;
    size_t length;  // 0: merged into its left neighbour
    int previous;   // -1: none
    int next;       // -1: none
  };

  struct Bigram {
    int left;
    int right;
    Rank rank;
    size_t length;  // left.length + right.length when queued; a mismatch later means stale
  };

  // The standard heap puts the greatest on top, so "less" here means "merges later": the lowest
  // rank, then the leftmost, is on top.
  struct HeapOrder {
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };

  // Not text_.substr: symbols lie inside the text, and its bounds check costs in this hot loop.
  std::string_view piece(int symbol) const {
    return std::string_view(text_.data() + symbols_[symbol].start, symbols_[symbol].length);
  }

  // Inlined by force: GCC 12 keeps it out of line (three call sites), which cost SentencePiece
  // encoding 4% more instructions than its own loop did before this class replaced it.
  __attribute__((always_inline)) void try_add(int left, int right) {
    if (left < 0 || right < 0) return;
    const std::string_view left_text = piece(left);
    const std::string_view right_text = piece(right);
    const std::optional<Rank> rank = rule_(left_text, right_text);
    if (!rank) return;
    heap_.push_back({left, right, *rank, left_text.size() + right_text.size()});
    std::push_heap(heap_.begin(), heap_.end(), HeapOrder());
  }

  Rule rule_;
  std::string_view text_;
  size_t symbols_end_ = 0;  // where the next add_symbol's symbol begins
  std::vector<Symbol> symbols_;
  std::vector<Bigram> heap_;
};

}  // namespace folio::tokenizer

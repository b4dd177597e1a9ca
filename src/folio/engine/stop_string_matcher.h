// StopStringMatcher: finds stop strings in streamed text without ever releasing text that lies
// at or past a stop string.
//
// Decoded text arrives in deltas. The matcher releases each delta except its *held* tail: the
// longest suffix of the unreleased text that is a proper prefix of some stop string (it may
// still grow into one). Generation stops at the first stop string to *complete* (the smallest
// end; on a tie, the earliest start), as it would when text arrives one character at a time, so
// the result does not depend on how the text is cut into deltas. The text before that
// occurrence is released and the rest (the stop string and anything after it) is dropped: the
// output never contains a stop string. When the sequence ends for another reason, flush() releases
// the held tail.
//
// Why the unreleased text is enough to search: a stop string starting inside released text
// would have made that text's suffix a prefix of the stop string, which is held, not released.
//
// Invariants: held text is shorter than the longest stop string; after a match nothing more is
// accepted. Thread-safety: one owner (the engine thread).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace folio::engine {

class StopStringMatcher {
 public:
  // Requires: no stop string is empty (Request validation rejects those).
  explicit StopStringMatcher(std::vector<std::string> stop_strings);

  struct Output {
    std::string released;                // text final now
    std::optional<size_t> matched_stop;  // index into the stop strings, when one occurred
  };
  // Requires: !stopped().
  Output push(std::string_view delta);
  // The held tail; the matcher keeps nothing afterwards.
  std::string flush();

  bool stopped() const { return stopped_; }
  const std::vector<std::string>& stop_strings() const { return stop_strings_; }

 private:
  size_t held_suffix_length() const;

  std::vector<std::string> stop_strings_;
  size_t longest_stop_ = 0;
  std::string unreleased_;
  bool stopped_ = false;
};

}  // namespace folio::engine

#include "folio/engine/stop_string_matcher.h"

#include <algorithm>
#include <utility>

#include "folio/base/check.h"

namespace folio::engine {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings)
    : stop_strings_(std::move(stop_strings)) {
  for (const std::string& stop : stop_strings_) {
    FOLIO_DCHECK(!stop.empty(), "empty stop string");
    longest_stop_ = std::max(longest_stop_, stop.size());
  }
}

StopStringMatcher::Output StopStringMatcher::push(std::string_view delta) {
  FOLIO_DCHECK(!stopped_, "push after a stop string matched");
  Output output;
  if (stop_strings_.empty()) {
    output.released.assign(delta);
    return output;
  }
  unreleased_.append(delta);
  // Generation stops at the first stop string to complete; when several complete at the same
  // character, the one starting earliest. No stop completed before this delta, so the first
  // occurrence of each in the unreleased text is the one that matters.
  size_t earliest_end = std::string::npos;
  size_t earliest = std::string::npos;
  for (size_t index = 0; index < stop_strings_.size(); ++index) {
    const size_t position = unreleased_.find(stop_strings_[index]);
    if (position == std::string::npos) continue;
    const size_t end = position + stop_strings_[index].size();
    if (end < earliest_end || (end == earliest_end && position < earliest)) {
      earliest_end = end;
      earliest = position;
      output.matched_stop = index;
    }
  }
  if (output.matched_stop.has_value()) {
    output.released = unreleased_.substr(0, earliest);
    unreleased_.clear();
    stopped_ = true;
    return output;
  }
  const size_t release = unreleased_.size() - held_suffix_length();
  output.released = unreleased_.substr(0, release);
  unreleased_.erase(0, release);
  return output;
}

std::string StopStringMatcher::flush() {
  return std::exchange(unreleased_, std::string());
}

size_t StopStringMatcher::held_suffix_length() const {
  const size_t most = std::min(unreleased_.size(), longest_stop_ - 1);
  for (size_t length = most; length > 0; --length) {
    const std::string_view suffix =
        std::string_view(unreleased_).substr(unreleased_.size() - length);
    for (const std::string& stop : stop_strings_) {
      if (stop.size() > length && std::string_view(stop).substr(0, length) == suffix) {
        return length;
      }
    }
  }
  return 0;
}

}  // namespace folio::engine

#include "folio/memory/page_table.h"

namespace folio::memory {

std::string_view page_state_name(PageState state) {
  switch (state) {
    case PageState::kFree:
      return "free";
    case PageState::kThreadHeld:
      return "thread_held";
    case PageState::kReserved:
      return "reserved";
    case PageState::kUnpinned:
      return "unpinned";
    case PageState::kPinned:
      return "pinned";
    case PageState::kReleasing:
      return "releasing";
  }
  return "unknown";
}

}  // namespace folio::memory

// The process's own memory, as Linux reports it, for `folio bench`'s memory line.
#pragma once

#include <cstdint>

namespace folio::app {

// The resident set size (/proc/self/statm); 0 where unknown. Counts a physical page once per
// mapping of it: a page of the multi-shape arena seen through N captured graphs' views counts
// N times, so with graphs this overstates what the process holds.
int64_t resident_set_bytes();

// The proportional set size (/proc/self/smaps_rollup "Pss"); 0 where unknown. A page mapped at
// several addresses of this process counts once (shared with other processes, in proportion),
// so it is the figure to hold against the memory budget. Reading it walks every mapping: call it
// at most a few times a second.
int64_t proportional_set_bytes();

}  // namespace folio::app

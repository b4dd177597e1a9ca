#include "apps/folio/process_memory.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace folio::app {

int64_t resident_set_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t proportional_set_bytes() {
  std::ifstream rollup("/proc/self/smaps_rollup");
  std::string field;
  int64_t kibibytes = 0;
  std::string unit;
  while (rollup >> field) {
    if (field == "Pss:") {
      if (!(rollup >> kibibytes >> unit)) return 0;
      return kibibytes << 10;
    }
    rollup.ignore(1 << 12, '\n');
  }
  return 0;
}

}  // namespace folio::app

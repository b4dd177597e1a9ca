// A one-line progress bar on stderr, redrawn in place ("\r[#####     ] 3/10 windows, ..."), for
// the commands that run long offline loads (bench, perplexity). The line ends once done == total.
#pragma once

#include <cstdint>
#include <string_view>

namespace folio::app {

// Draws `done` of `total` `unit` (a plural noun), then `detail` if not empty.
void render_progress(int64_t done, int64_t total, std::string_view unit,
                     std::string_view detail = {});

}  // namespace folio::app

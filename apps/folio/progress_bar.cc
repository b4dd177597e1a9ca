#include "apps/folio/progress_bar.h"

#include <cstdio>

namespace folio::app {

void render_progress(int64_t done, int64_t total, std::string_view unit, std::string_view detail) {
  constexpr int kWidth = 30;
  const int filled = total == 0 ? kWidth : static_cast<int>(done * kWidth / total);
  std::fprintf(stderr, "\r[%.*s%*s] %lld/%lld %.*s", filled, "##############################",
               kWidth - filled, "", static_cast<long long>(done), static_cast<long long>(total),
               static_cast<int>(unit.size()), unit.data());
  if (!detail.empty()) {
    std::fprintf(stderr, ", %.*s", static_cast<int>(detail.size()), detail.data());
  }
  if (done == total) std::fputs("\n", stderr);
  std::fflush(stderr);
}

}  // namespace folio::app

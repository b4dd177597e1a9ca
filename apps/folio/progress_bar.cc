#include "apps/folio/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "folio/base/check.h"

namespace folio::app {
namespace {

constexpr int kBarWidth = 24;
constexpr auto kRedrawInterval = std::chrono::milliseconds(100);

std::string format_amount(int64_t value, ProgressUnit unit) {
  if (unit == ProgressUnit::kBytes) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f", static_cast<double>(value) / (1 << 20));
    return text;
  }
  return std::to_string(value);
}

}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, ProgressUnit unit, std::string item_name,
                         bool enabled)
    : label_(std::move(label)),
      total_(total),
      unit_(unit),
      item_name_(std::move(item_name)),
      enabled_(enabled),
      interactive_(isatty(STDERR_FILENO) == 1),
      started_(std::chrono::steady_clock::now()),
      last_draw_(started_ - kRedrawInterval) {
  FOLIO_CHECK(total >= 0, "progress total {} is negative", total);
}

ProgressBar::~ProgressBar() {
  finish();
}

void ProgressBar::update(int64_t done) {
  FOLIO_DCHECK(done >= done_ && done <= total_, "progress {} outside [{}, {}]", done, done_,
               total_);
  done_ = done;
  if (!enabled_ || finished_ || !interactive_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < kRedrawInterval) return;
  last_draw_ = now;
  draw();
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  draw();
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

void ProgressBar::draw() {
  const int filled =
      total_ == 0 ? kBarWidth : static_cast<int>(done_ * kBarWidth / std::max<int64_t>(total_, 1));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  const double rate = seconds > 0 ? static_cast<double>(done_) / seconds : 0.0;
  const std::string unit = unit_ == ProgressUnit::kBytes ? "MiB" : item_name_;
  const std::string rate_text =
      unit_ == ProgressUnit::kBytes ? format_amount(static_cast<int64_t>(rate), unit_) : [&] {
        char text[32];
        std::snprintf(text, sizeof(text), "%.1f", rate);
        return std::string(text);
      }();
  std::fprintf(stderr, "%s%s [%.*s%.*s] %s/%s %s  %s %s/s", interactive_ ? "\r" : "",
               label_.c_str(), filled, "########################", kBarWidth - filled,
               "------------------------", format_amount(done_, unit_).c_str(),
               format_amount(total_, unit_).c_str(), unit.c_str(), rate_text.c_str(), unit.c_str());
  std::fflush(stderr);
}

}  // namespace folio::app

// ProgressBar: one status line on stderr, redrawn in place, for work a user waits on (loading a
// model's weights, a benchmark's requests, perplexity windows):
//   loading weights [##########----------]  40.2/80.4 MiB  612.3 MiB/s
// Redraws are rate-limited (every 100 ms and at the end) so a tight loop can call update() on
// every item. When stderr is not a terminal, only the final line is printed (logs stay clean).
//
// Thread-safety: one thread drives a bar.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace folio::app {

enum class ProgressUnit { kItems, kBytes };

class ProgressBar {
 public:
  // `enabled` false: the bar prints nothing (the -q flag). `item_name` names what is counted
  // ("requests", "windows"); unused for bytes.
  ProgressBar(std::string label, int64_t total, ProgressUnit unit, std::string item_name = "",
              bool enabled = true);
  ~ProgressBar();  // finishes the line if finish() was not called
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Requires: 0 <= done <= total, non-decreasing.
  void update(int64_t done);
  // Draws the final state and ends the line; later calls do nothing.
  void finish();

 private:
  void draw();

  std::string label_;
  int64_t total_;
  ProgressUnit unit_;
  std::string item_name_;
  bool enabled_;
  bool interactive_;  // stderr is a terminal: redraw in place
  bool finished_ = false;
  int64_t done_ = 0;
  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace folio::app

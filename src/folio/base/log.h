// Logging through spdlog (a maintained, fmt-based logger with levels and sinks). Folio logs to
// stderr; the level comes from FOLIO_LOG_LEVEL (trace, debug, info, warn, error, off) or
// set_log_level(). Per-token and per-page paths never log above debug.
#pragma once

#include <string_view>

#include <spdlog/spdlog.h>

#include "folio/base/status.h"

namespace folio::log {

using spdlog::critical;
using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::trace;
using spdlog::warn;

// Accepts spdlog's level names; an unknown name is an invalid-argument error.
Status set_log_level(std::string_view level);

// Applies FOLIO_LOG_LEVEL if set; called once by programs at start-up.
void init_from_environment();

}  // namespace folio::log

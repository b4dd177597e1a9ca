#include "folio/base/log.h"

#include <cstdlib>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace folio::log {

Status set_log_level(std::string_view level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  // from_str returns `off` for unknown names; only accept `off` when it was asked for.
  if (parsed == spdlog::level::off && level != "off") {
    return invalid_argument("log level '{}' is not one of trace, debug, info, warn, error, off",
                            level);
  }
  spdlog::set_level(parsed);
  return Status();
}

void init_from_environment() {
  auto logger = spdlog::stderr_color_mt("folio");
  logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_default_logger(logger);
  if (const char* level = std::getenv("FOLIO_LOG_LEVEL")) {
    Status status = set_log_level(level);
    if (!status.ok()) spdlog::warn("FOLIO_LOG_LEVEL: {}", status.message());
  }
}

}  // namespace folio::log

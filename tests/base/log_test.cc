#include "folio/base/log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace folio::log {
namespace {

class LogLevelTest : public ::testing::Test {
 protected:
  void TearDown() override { spdlog::set_level(saved_); }
  spdlog::level::level_enum saved_ = spdlog::get_level();
};

TEST_F(LogLevelTest, AcceptsEveryLevelName) {
  const std::pair<const char*, spdlog::level::level_enum> levels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"off", spdlog::level::off}};
  for (const auto& [name, level] : levels) {
    ASSERT_TRUE(set_log_level(name).ok()) << name;
    EXPECT_EQ(spdlog::get_level(), level) << name;
  }
}

TEST_F(LogLevelTest, UnknownLevelIsInvalidArgumentAndKeepsLevel) {
  ASSERT_TRUE(set_log_level("warn").ok());
  for (const char* bad : {"verbose", "", "INFO ", "offf"}) {
    const Status status = set_log_level(bad);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr("is not one of trace, debug, info, warn, error, off"));
    EXPECT_EQ(spdlog::get_level(), spdlog::level::warn) << "bad input must not change the level";
  }
}

}  // namespace
}  // namespace folio::log

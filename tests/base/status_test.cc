#include "folio/base/status.h"

#include <cerrno>
#include <memory>
#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/base/result.h"

namespace folio {
namespace {

using ::testing::HasSubstr;

TEST(StatusTest, OkStatusHasNoMessage) {
  const Status status;
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kOk);
  EXPECT_EQ(status.message(), "");
  EXPECT_EQ(status.to_string(), "OK");
  EXPECT_EQ(status, Status::ok_status());
}

TEST(StatusTest, BuildersFormatMessageAndCode) {
  const Status status = resource_exhausted("page pool has {} free pages, {} requested", 3, 8);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "page pool has 3 free pages, 8 requested");
  EXPECT_EQ(status.to_string(), "RESOURCE_EXHAUSTED: page pool has 3 free pages, 8 requested");
  EXPECT_EQ(fmt::format("{}", status), status.to_string());
}

TEST(StatusTest, EveryCodeHasADistinctName) {
  const StatusCode codes[] = {StatusCode::kOk,
                              StatusCode::kInvalidArgument,
                              StatusCode::kOutOfRange,
                              StatusCode::kNotFound,
                              StatusCode::kAlreadyExists,
                              StatusCode::kFailedPrecondition,
                              StatusCode::kResourceExhausted,
                              StatusCode::kUnavailable,
                              StatusCode::kCancelled,
                              StatusCode::kDeadlineExceeded,
                              StatusCode::kDataLoss,
                              StatusCode::kInternal};
  std::set<std::string_view> names;
  for (StatusCode code : codes) {
    EXPECT_NE(status_code_name(code), "UNKNOWN");
    names.insert(status_code_name(code));
  }
  EXPECT_EQ(names.size(), std::size(codes));
  EXPECT_EQ(Status(StatusCode::kDataLoss, "x").to_string(), "DATA_LOSS: x");
}

TEST(StatusTest, OkCodeWithMessageIsOk) {
  const Status status(StatusCode::kOk, "ignored");
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.message(), "");
}

TEST(StatusTest, WithContextPrefixesMessageAndKeepsCode) {
  const Status status = data_loss("tensor '{}' is truncated", "blk.0.attn_q.weight")
                            .with_context("loading model.gguf");
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(status.message(), "loading model.gguf: tensor 'blk.0.attn_q.weight' is truncated");
  EXPECT_TRUE(Status().with_context("anything").ok());
}

TEST(StatusTest, CopiesCompareEqualAndShareNothingMutable) {
  const Status original = not_found("model '{}'", "llama");
  Status copy = original;
  EXPECT_EQ(copy, original);
  copy = copy.with_context("x");
  EXPECT_NE(copy, original);
  EXPECT_EQ(original.message(), "model 'llama'");
  EXPECT_NE(not_found("a"), invalid_argument("a"));
}

TEST(StatusTest, ErrnoStatusNamesCallAndMapsCode) {
  errno = ENOMEM;
  Status status = errno_status("mmap", "reserving 4 GiB");
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()), HasSubstr("reserving 4 GiB: mmap failed: "));
  errno = ENOENT;
  EXPECT_EQ(errno_status("open", "x").code(), StatusCode::kNotFound);
  errno = EINVAL;
  EXPECT_EQ(errno_status("open", "x").code(), StatusCode::kInvalidArgument);
  errno = EBADF;
  EXPECT_EQ(errno_status("close", "x").code(), StatusCode::kInternal);
}

Result<int> parse_positive(int value) {
  if (value <= 0) return invalid_argument("{} is not positive", value);
  return value;
}

Result<int> doubled(int value) {
  FOLIO_ASSIGN_OR_RETURN(const int positive, parse_positive(value));
  return positive * 2;
}

Status check_both(int a, int b) {
  FOLIO_RETURN_IF_ERROR(parse_positive(a).status());
  FOLIO_RETURN_IF_ERROR(parse_positive(b).status().with_context("second"));
  return Status();
}

TEST(ResultTest, HoldsValueOrStatus) {
  Result<int> good = parse_positive(4);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(good.status().ok());
  EXPECT_EQ(*good, 4);
  EXPECT_EQ(good.value_or(-1), 4);
  Result<int> bad = parse_positive(-2);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "-2 is not positive");
  EXPECT_EQ(bad.value_or(-1), -1);
}

TEST(ResultTest, AssignOrReturnPropagatesErrorUnchanged) {
  EXPECT_EQ(*doubled(21), 42);
  const Result<int> failed = doubled(0);
  EXPECT_EQ(failed.status(), invalid_argument("0 is not positive"));
}

TEST(ResultTest, ReturnIfErrorStopsAtFirstFailure) {
  EXPECT_TRUE(check_both(1, 2).ok());
  EXPECT_EQ(check_both(-1, -2).message(), "-1 is not positive");
  EXPECT_EQ(check_both(1, -2).message(), "second: -2 is not positive");
}

TEST(ResultTest, MoveOnlyValuesMoveOut) {
  auto make = []() -> Result<std::unique_ptr<int>> { return std::make_unique<int>(7); };
  std::unique_ptr<int> value = make().value();
  EXPECT_EQ(*value, 7);
  Result<std::string> text = std::string("abc");
  EXPECT_EQ(text->size(), 3u);
  auto forward = [&]() -> Result<std::unique_ptr<int>> {
    FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<int> inner, make());
    *inner += 1;
    return inner;
  };
  EXPECT_EQ(**forward(), 8);
}

TEST(ResultDeathTest, ValueOfFailedResultAbortsWithItsStatus) {
  Result<int> bad = parse_positive(-3);
  EXPECT_DEATH((void)bad.value(),
               "value\\(\\) of a failed Result: INVALID_ARGUMENT: -3 is not positive");
}

TEST(ResultDeathTest, ConstructingFromOkStatusAborts) {
  EXPECT_DEATH(Result<int>{Status()}, "Result constructed from an OK status");
}

}  // namespace
}  // namespace folio

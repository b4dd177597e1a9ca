#include "folio/exec/bucket_policy.h"

#include <gtest/gtest.h>

namespace folio::exec {
namespace {

TEST(BucketPolicyTest, DefaultLadderMatchesDocumentedSteps) {
  const std::vector<int32_t> ladder = BucketPolicy::default_ladder();
  ASSERT_EQ(ladder.front(), 1);
  EXPECT_EQ(ladder.back(), 512);
  // 1, 2, 4, then 8..64 by 8 (8 sizes), then 80..512 by 16 (28 sizes).
  EXPECT_EQ(ladder.size(), 3u + 8u + 28u);
  EXPECT_EQ(ladder[3], 8);
  EXPECT_EQ(ladder[10], 64);
  EXPECT_EQ(ladder[11], 80);
}

TEST(BucketPolicyTest, PaddedSizeIsSmallestBucketAtLeastCount) {
  Result<BucketPolicy> policy = BucketPolicy::create(BucketPolicy::default_ladder());
  ASSERT_TRUE(policy.ok());
  const std::vector<int32_t>& ladder = policy->ladder();
  for (int32_t count = 1; count <= policy->largest(); ++count) {
    // Independent reference: linear scan of the ladder.
    int32_t expected = 0;
    for (int32_t size : ladder) {
      if (size >= count) {
        expected = size;
        break;
      }
    }
    ASSERT_EQ(policy->padded_size(count), expected) << "count " << count;
  }
  EXPECT_EQ(policy->padded_size(3), 4);
  EXPECT_EQ(policy->padded_size(65), 80);
  EXPECT_FALSE(policy->padded_size(513).has_value());
}

TEST(BucketPolicyTest, RejectsBadLadders) {
  EXPECT_EQ(BucketPolicy::create({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BucketPolicy::create({0, 4}).status().code(), StatusCode::kInvalidArgument);
  Status decreasing = BucketPolicy::create({1, 8, 4}).status();
  EXPECT_EQ(decreasing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(decreasing.message().find("4 follows 8"), std::string_view::npos)
      << decreasing.message();
  EXPECT_EQ(BucketPolicy::create({1, 1}).status().code(), StatusCode::kInvalidArgument);
}

TEST(BucketPolicyTest, ParsesCommaSeparatedList) {
  Result<BucketPolicy> policy = BucketPolicy::parse("1,2,8,32");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->ladder(), (std::vector<int32_t>{1, 2, 8, 32}));
  EXPECT_EQ(policy->padded_size(9), 32);
  EXPECT_FALSE(BucketPolicy::parse("1,two,3").ok());
  EXPECT_FALSE(BucketPolicy::parse("1,,3").ok());
  EXPECT_FALSE(BucketPolicy::parse("").ok());
}

TEST(BucketPolicyTest, BucketKeysDifferByPhase) {
  BucketKey decode{8, ir::StepPhase::kDecode};
  BucketKey prefill{8, ir::StepPhase::kPrefill};
  EXPECT_NE(decode, prefill);
  EXPECT_NE(std::hash<BucketKey>()(decode), std::hash<BucketKey>()(prefill));
}

}  // namespace
}  // namespace folio::exec

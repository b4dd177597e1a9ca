#include "folio/dist/gloo_collectives.h"

#include <signal.h>

#include <gtest/gtest.h>

#include "collectives_contract.h"

namespace folio::dist::testing {
namespace {

using folio::testing::gloo_options;
using folio::testing::make_gloo_group_in_threads;
using folio::testing::TemporaryDirectory;

struct GlooBackend {
  static Result<Members> make(const std::string& directory, int size,
                              std::chrono::milliseconds timeout, const std::string& group_id) {
    return make_gloo_group_in_threads(directory, size, timeout, group_id);
  }
  // The ring adds in an order of its own; with two members addition order cannot matter.
  static bool sums_in_rank_order(int size) { return size <= 2; }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Gloo, CollectivesContractTest, GlooBackend);

TEST(GlooCollectivesTest, MalformedOptionsAreRefused) {
  TemporaryDirectory directory;
  const auto code = [&](GlooGroupOptions options) {
    return connect_gloo_group(options).status().code();
  };
  auto options = gloo_options(directory.path(), 0, 2, kFailureTimeout);
  options.rank = 2;
  EXPECT_EQ(code(options), StatusCode::kInvalidArgument);
  options.rank = -1;
  EXPECT_EQ(code(options), StatusCode::kInvalidArgument);
  options = gloo_options(directory.path(), 0, 0, kFailureTimeout);
  EXPECT_EQ(code(options), StatusCode::kInvalidArgument);
  options = gloo_options(directory.path(), 0, 2, std::chrono::milliseconds(0));
  EXPECT_EQ(code(options), StatusCode::kInvalidArgument);
  options = gloo_options(directory.path(), 0, 2, kFailureTimeout, "a/b");
  EXPECT_EQ(code(options), StatusCode::kInvalidArgument);
  options = gloo_options(directory.path() + "/missing", 0, 2, kFailureTimeout);
  const Status missing = connect_gloo_group(options).status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find("/missing"), std::string_view::npos) << missing;
}

TEST(GlooCollectivesTest, AMemberThatNeverJoinsIsNamedByTheOthers) {
  TemporaryDirectory directory;
  std::vector<Status> outcomes(3);
  // Ranks 0 and 2 of 3 join; rank 1 never does.
  run_on_ranks(3, [&](int rank) {
    if (rank == 1) return;
    outcomes[rank] =
        connect_gloo_group(gloo_options(directory.path(), rank, 3, kFailureTimeout)).status();
  });
  for (int rank : {0, 2}) {
    EXPECT_EQ(outcomes[rank].code(), StatusCode::kDeadlineExceeded) << outcomes[rank];
    EXPECT_NE(outcomes[rank].message().find("rank 1 did not join within 1000 ms"),
              std::string_view::npos)
        << outcomes[rank];
  }
}

TEST(GlooCollectivesTest, AGroupFormsOncePerEpoch) {
  TemporaryDirectory directory;
  {
    auto members = make_gloo_group_in_threads(directory.path(), 2, kHealthyTimeout, "g", 0);
    ASSERT_TRUE(members.ok()) << members.status();
  }
  const Status again =
      make_gloo_group_in_threads(directory.path(), 2, kFailureTimeout, "g", 0).status();
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again;
  EXPECT_NE(again.message().find("new epoch"), std::string_view::npos) << again;
  auto next = make_gloo_group_in_threads(directory.path(), 2, kHealthyTimeout, "g", 1);
  ASSERT_TRUE(next.ok()) << next.status();
  run_on_ranks(2, [&](int rank) {
    std::vector<float> values = {1.5f};
    FOLIO_EXPECT_OK((*next)[rank]->all_reduce_sum(values));
    EXPECT_EQ(values[0], 3.0f);
  });
}

TEST(GlooCollectivesTest, SigpipeIsIgnoredOnceAGroupForms) {
  TemporaryDirectory directory;
  auto member = connect_gloo_group(gloo_options(directory.path(), 0, 1, kHealthyTimeout));
  ASSERT_TRUE(member.ok()) << member.status();
  struct sigaction current = {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &current), 0);
  EXPECT_EQ(current.sa_handler, SIG_IGN);
}

}  // namespace
}  // namespace folio::dist::testing

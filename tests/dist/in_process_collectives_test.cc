#include "folio/dist/in_process_collectives.h"

#include <gtest/gtest.h>

#include "collectives_contract.h"

namespace folio::dist::testing {
namespace {

struct InProcessBackend {
  static Result<Members> make(const std::string& /*directory*/, int size,
                              std::chrono::milliseconds timeout, const std::string& /*group_id*/) {
    return make_in_process_group(size, timeout);
  }
  static bool sums_in_rank_order(int /*size*/) { return true; }
};

INSTANTIATE_TYPED_TEST_SUITE_P(InProcess, CollectivesContractTest, InProcessBackend);

TEST(InProcessCollectivesTest, MalformedGroupsAreRefused) {
  EXPECT_EQ(make_in_process_group(0, kHealthyTimeout).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(make_in_process_group(2, std::chrono::milliseconds(0)).status().code(),
            StatusCode::kInvalidArgument);
}

// The in-process backend sees every member's call, so it names the disagreement exactly.
TEST(InProcessCollectivesTest, DisagreeingCallsAreNamedOnEveryRank) {
  auto members = make_in_process_group(3, kHealthyTimeout);
  ASSERT_TRUE(members.ok()) << members.status();
  std::vector<Status> outcomes(3);
  run_on_ranks(3, [&](int rank) {
    std::vector<float> values(rank == 2 ? 769 : 768, 1.0f);
    outcomes[rank] = (*members)[rank]->all_reduce_sum(values);
  });
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(outcomes[rank].code(), StatusCode::kInvalidArgument) << outcomes[rank];
    EXPECT_NE(outcomes[rank].message().find("769 floats"), std::string_view::npos)
        << outcomes[rank];
  }
}

TEST(InProcessCollectivesTest, ARecvOfAnotherSizeIsNamedOnBothSides) {
  auto members = make_in_process_group(2, kHealthyTimeout);
  ASSERT_TRUE(members.ok()) << members.status();
  std::vector<Status> outcomes(2);
  run_on_ranks(2, [&](int rank) {
    std::vector<std::byte> buffer(rank == 0 ? 4096 : 3072);
    outcomes[rank] = rank == 0 ? (*members)[0]->send(buffer, 1) : (*members)[1]->recv(buffer, 0);
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(outcomes[rank].code(), StatusCode::kInvalidArgument) << outcomes[rank];
    EXPECT_NE(outcomes[rank].message().find("expected 3072 bytes from rank 0, which sent 4096"),
              std::string_view::npos)
        << outcomes[rank];
  }
}

// Stress under ThreadSanitizer: many small operations of every kind, members interleaving
// freely; every sum is checked against the rank-order reference.
TEST(InProcessCollectivesTest, ManyMixedOperationsStayConsistent) {
  constexpr int kSize = 4;
  auto members = make_in_process_group(kSize, kHealthyTimeout);
  ASSERT_TRUE(members.ok()) << members.status();
  run_on_ranks(kSize, [&](int rank) {
    Collectives& member = *(*members)[rank];
    for (int round = 0; round < 200; ++round) {
      const size_t count = 1 + round % 17;
      std::vector<float> values = rank_values(rank, count, round);
      FOLIO_EXPECT_OK(member.all_reduce_sum(values));
      std::vector<std::vector<float>> inputs;
      for (int from = 0; from < kSize; ++from) inputs.push_back(rank_values(from, count, round));
      EXPECT_TRUE(bit_equal(values, rank_order_sum(inputs)));
      std::vector<std::byte> buffer(count);
      if (rank % 2 == 0) {
        FOLIO_EXPECT_OK(member.send(rank_bytes(rank, count, round), rank + 1));
      } else {
        FOLIO_EXPECT_OK(member.recv(buffer, rank - 1));
        EXPECT_EQ(buffer, rank_bytes(rank - 1, count, round));
      }
      if (round % 10 == 0) FOLIO_EXPECT_OK(member.barrier());
    }
  });
}

}  // namespace
}  // namespace folio::dist::testing

// gloo members as real processes over loopback: this test process is rank 0, the others are
// dist_collectives_peer processes started with posix_spawn (no fork of a threaded process).
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "collectives_script.h"
#include "collectives_test_util.h"
#include "folio/dist/gloo_collectives.h"
#include "testing/child_process.h"
#include "testing/collective_groups.h"

namespace folio::dist::testing {
namespace {

using folio::testing::TemporaryDirectory;
using namespace std::chrono_literals;

// A dist_collectives_peer process.
class PeerProcess : public folio::testing::ChildProcess {
 public:
  explicit PeerProcess(std::vector<std::string> arguments)
      : ChildProcess(with_binary(std::move(arguments)), /*capture_output=*/false) {}

 private:
  static std::vector<std::string> with_binary(std::vector<std::string> arguments) {
    arguments.insert(arguments.begin(), FOLIO_DIST_PEER_PATH);
    return arguments;
  }
};

GlooGroupOptions parent_options(const std::string& store, int size,
                                std::chrono::milliseconds timeout) {
  return GlooGroupOptions{.rank = 0,
                          .size = size,
                          .store_directory = store,
                          .store_address = {},
                          .group_id = "processes",
                          .epoch = 0,
                          .host = "127.0.0.1",
                          .timeout = timeout};
}

TEST(GlooProcessTest, ThreeProcessesAgreeBitForBit) {
  TemporaryDirectory store;
  constexpr int kSize = 3;
  std::vector<std::unique_ptr<PeerProcess>> peers;
  for (int rank = 1; rank < kSize; ++rank) {
    peers.push_back(std::make_unique<PeerProcess>(std::vector<std::string>{
        "script", store.path(), std::to_string(rank), std::to_string(kSize), "60000",
        store.path() + "/transcript" + std::to_string(rank)}));
  }
  auto member = connect_gloo_group(parent_options(store.path(), kSize, 60s));
  ASSERT_TRUE(member.ok()) << member.status();
  std::vector<std::byte> transcript;
  FOLIO_EXPECT_OK(run_script(**member, transcript));
  for (int rank = 1; rank < kSize; ++rank) {
    const int status = peers[rank - 1]->wait();
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << rank << ": " << status;
    std::ifstream file(store.path() + "/transcript" + std::to_string(rank), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
    ASSERT_EQ(bytes.size(), transcript.size()) << "rank " << rank;
    EXPECT_EQ(std::memcmp(bytes.data(), transcript.data(), bytes.size()), 0) << "rank " << rank;
  }
  // The sums in the transcript (it starts with them) against the double reference.
  size_t offset = 0;
  for (size_t count : script_reduce_counts()) {
    std::vector<std::vector<float>> inputs;
    for (int rank = 0; rank < kSize; ++rank) inputs.push_back(rank_values(rank, count));
    std::vector<float> sums(count);
    if (count > 0) std::memcpy(sums.data(), transcript.data() + offset, count * sizeof(float));
    offset += count * sizeof(float);
    expect_within_summation_bound(sums, inputs);
  }
}

TEST(GlooProcessTest, AKilledPeerProcessFailsTheCallInsteadOfTheProcess) {
  TemporaryDirectory store;
  PeerProcess peer({"join-and-wait", store.path(), "1", "2", "60000"});
  auto member = connect_gloo_group(parent_options(store.path(), 2, 2000ms));
  ASSERT_TRUE(member.ok()) << member.status();
  peer.signal(SIGKILL);
  const int status = peer.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  // Writes to the dead peer fail (EPIPE, SIGPIPE ignored) or its connection reads as closed.
  std::vector<float> values(768, 1.0f);
  const Status reduced = (*member)->all_reduce_sum(values);
  EXPECT_TRUE(reduced.code() == StatusCode::kUnavailable ||
              reduced.code() == StatusCode::kDeadlineExceeded)
      << reduced;
  EXPECT_NE(reduced.message().find("rank 0: all_reduce_sum"), std::string_view::npos) << reduced;
  EXPECT_EQ((*member)->barrier().code(), StatusCode::kFailedPrecondition);
}

TEST(GlooProcessTest, AStoppedPeerProcessTimesOut) {
  TemporaryDirectory store;
  PeerProcess peer({"join-and-wait", store.path(), "1", "2", "60000"});
  // Long enough for the peer process to start and join on a loaded machine.
  auto member = connect_gloo_group(parent_options(store.path(), 2, 2000ms));
  ASSERT_TRUE(member.ok()) << member.status();
  peer.signal(SIGSTOP);
  peer.wait_until_stopped();
  std::vector<float> values(768, 1.0f);
  const Status reduced = (*member)->all_reduce_sum(values);
  EXPECT_EQ(reduced.code(), StatusCode::kDeadlineExceeded) << reduced;
  EXPECT_NE(reduced.message().find("within 2000 ms"), std::string_view::npos) << reduced;
}

}  // namespace
}  // namespace folio::dist::testing

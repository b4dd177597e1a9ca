#include "folio/dist/in_process_collectives.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "folio/base/check.h"
#include "folio/base/mutex.h"

namespace folio::dist {
namespace {

using Clock = std::chrono::steady_clock;

// One member's published call: what it asked for (compared across members) and its buffer.
struct Contribution {
  CollectiveOp op = CollectiveOp::kBarrier;
  size_t bytes = 0;
  int root = -1;
  const std::byte* input = nullptr;

  bool same_call(const Contribution& other) const {
    return op == other.op && bytes == other.bytes && root == other.root;
  }
};

std::string describe(const Contribution& call) {
  switch (call.op) {
    case CollectiveOp::kAllReduceSum:
      return fmt::format("all_reduce_sum of {} floats", call.bytes / sizeof(float));
    case CollectiveOp::kAllGather:
      return fmt::format("all_gather of {} bytes per rank", call.bytes);
    case CollectiveOp::kBroadcast:
      return fmt::format("broadcast of {} bytes from root {}", call.bytes, call.root);
    case CollectiveOp::kBarrier:
      return "barrier";
    case CollectiveOp::kSend:
    case CollectiveOp::kRecv:
      break;
  }
  return std::string(collective_op_name(call.op));
}

// A send waiting for its receiver. Invariant: posted only while the sender is inside send().
struct Mailbox {
  const std::byte* data = nullptr;
  size_t bytes = 0;
  bool posted = false;
  bool taken = false;
  Status result;  // set by the receiver when it takes the message
};

// Shared by the members of one group.
struct GroupState {
  GroupState(int size, std::chrono::milliseconds timeout)
      : size(size),
        timeout(timeout),
        arrived(size, 0),
        reading(size, false),
        contributions(size),
        mailboxes(static_cast<size_t>(size) * size) {}

  const int size;
  const std::chrono::milliseconds timeout;

  Mutex mutex;
  std::condition_variable changed;
  // The last step each member reached (steps count from 1, identically on every member).
  std::vector<uint64_t> arrived FOLIO_GUARDED_BY(mutex);
  // Members between the two steps of an operation, reading the others' buffers.
  std::vector<bool> reading FOLIO_GUARDED_BY(mutex);
  std::vector<Contribution> contributions FOLIO_GUARDED_BY(mutex);
  // [sender * size + receiver]
  std::vector<Mailbox> mailboxes FOLIO_GUARDED_BY(mutex);
  // The first error that broke the group; OK while it is whole.
  Status broken FOLIO_GUARDED_BY(mutex);

  // Records the first error and wakes every waiting member.
  void break_group(const Status& error) FOLIO_REQUIRES(mutex) {
    if (broken.ok()) broken = error;
    changed.notify_all();
  }
};

class InProcessMember final : public Collectives {
 public:
  InProcessMember(std::shared_ptr<GroupState> state, int rank)
      : owner_(std::move(state)), group_(*owner_), rank_(rank) {}

  ~InProcessMember() override {
    MutexLock lock(group_.mutex);
    group_.break_group(unavailable(
        "rank {} left the group (its Collectives was destroyed); form a new group", rank_));
  }

  int rank() const override { return rank_; }
  int size() const override { return group_.size; }
  std::chrono::milliseconds timeout() const override { return group_.timeout; }

  Status all_reduce_sum(std::span<float> values) override {
    const Contribution call{.op = CollectiveOp::kAllReduceSum,
                            .bytes = values.size_bytes(),
                            .root = -1,
                            .input = reinterpret_cast<const std::byte*>(values.data())};
    if (values.empty()) return check_whole(call.op);
    FOLIO_RETURN_IF_ERROR(publish_and_wait(call));
    scratch_.resize(values.size());
    float* sum = scratch_.data();
    const auto* first = reinterpret_cast<const float*>(inputs_[0]);
    std::copy(first, first + values.size(), sum);
    for (int member = 1; member < size(); ++member) {
      const auto* addend = reinterpret_cast<const float*>(inputs_[member]);
      for (size_t i = 0; i < values.size(); ++i) sum[i] += addend[i];
    }
    FOLIO_RETURN_IF_ERROR(finish_reading(call.op));
    std::memcpy(values.data(), sum, values.size_bytes());
    return Status();
  }

  Status all_gather(std::span<const std::byte> input, std::span<std::byte> output) override {
    FOLIO_RETURN_IF_ERROR(
        check_all_gather_sizes(*this, input.size(), output.size(), spans_overlap(input, output)));
    const Contribution call{
        .op = CollectiveOp::kAllGather, .bytes = input.size(), .root = -1, .input = input.data()};
    if (input.empty()) return check_whole(call.op);
    FOLIO_RETURN_IF_ERROR(publish_and_wait(call));
    // Output is private to this member: written while reading, no scratch needed.
    for (int member = 0; member < size(); ++member) {
      std::memcpy(output.data() + member * input.size(), inputs_[member], input.size());
    }
    return finish_reading(call.op);
  }

  Status broadcast(std::span<std::byte> buffer, int root) override {
    FOLIO_RETURN_IF_ERROR(check_root(*this, root));
    const Contribution call{.op = CollectiveOp::kBroadcast,
                            .bytes = buffer.size(),
                            .root = root,
                            .input = buffer.data()};
    if (buffer.empty()) return check_whole(call.op);
    FOLIO_RETURN_IF_ERROR(publish_and_wait(call));
    // The root's buffer is only read (by the others) until every member finished reading.
    if (rank_ != root) std::memcpy(buffer.data(), inputs_[root], buffer.size());
    return finish_reading(call.op);
  }

  Status barrier() override {
    const Contribution call{.op = CollectiveOp::kBarrier, .bytes = 0, .root = -1, .input = nullptr};
    FOLIO_RETURN_IF_ERROR(publish_and_wait(call));
    return finish_reading(call.op);
  }

  Status send(std::span<const std::byte> bytes, int peer) override;
  Status recv(std::span<std::byte> buffer, int peer) override;

 private:
  // kFailedPrecondition quoting the first error, once the group is broken.
  Status broken_status(CollectiveOp op) const FOLIO_REQUIRES(group_.mutex) {
    return failed_precondition("rank {}: {} on a broken group, which stays broken: {}", rank_,
                               collective_op_name(op), group_.broken.to_string());
  }
  // The error of a call that was waiting when the group broke: the first error's code.
  Status gave_up_status(CollectiveOp op) const FOLIO_REQUIRES(group_.mutex) {
    return Status(group_.broken.code(),
                  fmt::format("rank {}: {} failed: {}", rank_, collective_op_name(op),
                              group_.broken.message()));
  }

  Status check_whole(CollectiveOp op) {
    MutexLock lock(group_.mutex);
    return group_.broken.ok() ? Status() : broken_status(op);
  }

  // Arrives at the next step and waits (up to the timeout) for every member to arrive.
  Status arrive_and_wait(MutexLock& lock, CollectiveOp op) FOLIO_REQUIRES(group_.mutex) {
    ++step_;
    group_.arrived[rank_] = step_;
    group_.changed.notify_all();
    const uint64_t step = step_;
    const bool all_arrived = lock.wait_until(
        group_.changed, Clock::now() + group_.timeout, [&]() FOLIO_REQUIRES(group_.mutex) {
          return !group_.broken.ok() ||
                 std::all_of(group_.arrived.begin(), group_.arrived.end(),
                             [&](uint64_t arrived) { return arrived >= step; });
        });
    if (!group_.broken.ok()) return gave_up_status(op);
    if (all_arrived) return Status();
    std::vector<int> late;
    for (int member = 0; member < group_.size; ++member) {
      if (group_.arrived[member] < step) late.push_back(member);
    }
    const Status error = deadline_exceeded(
        "rank {}: rank{} {} did not reach {} within {} ms (slow, hung, or calling another "
        "operation)",
        rank_, late.size() == 1 ? "" : "s", fmt::join(late, ", "), collective_op_name(op),
        group_.timeout.count());
    group_.break_group(error);
    return error;
  }

  // Step one: publish this member's call, wait for all, compare the calls and note the peers'
  // buffers in inputs_.
  Status publish_and_wait(const Contribution& call) {
    MutexLock lock(group_.mutex);
    if (!group_.broken.ok()) return broken_status(call.op);
    group_.contributions[rank_] = call;
    FOLIO_RETURN_IF_ERROR(arrive_and_wait(lock, call.op));
    for (int member = 0; member < group_.size; ++member) {
      const Contribution& other = group_.contributions[member];
      if (!other.same_call(call)) {
        const Status error = invalid_argument(
            "rank {}: the ranks disagree on the call: rank {} called {}, rank {} called {}", rank_,
            rank_, describe(call), member, describe(other));
        group_.break_group(error);
        return error;
      }
    }
    inputs_.resize(group_.size);
    for (int member = 0; member < group_.size; ++member) {
      inputs_[member] = group_.contributions[member].input;
    }
    group_.reading[rank_] = true;
    return Status();
  }

  // Step two: wait until no member reads this member's buffer any more. When the group broke
  // meanwhile, this still waits for the members that are reading (pure computation, bounded)
  // so no caller frees a buffer another thread is reading.
  Status finish_reading(CollectiveOp op) {
    MutexLock lock(group_.mutex);
    group_.reading[rank_] = false;
    Status status = arrive_and_wait(lock, op);
    if (!status.ok()) {
      lock.wait(group_.changed, [&]() FOLIO_REQUIRES(group_.mutex) {
        return std::none_of(group_.reading.begin(), group_.reading.end(),
                            [](bool reading) { return reading; });
      });
    }
    return status;
  }

  std::shared_ptr<GroupState> owner_;  // keeps the group's state alive for every member
  GroupState& group_;                  // *owner_, one name for the thread-safety analysis
  const int rank_;
  uint64_t step_ = 0;                     // the steps this member took
  std::vector<const std::byte*> inputs_;  // the members' buffers of the current call
  std::vector<float> scratch_;            // all_reduce_sum's result before it is written back
};

Status InProcessMember::send(std::span<const std::byte> bytes, int peer) {
  FOLIO_RETURN_IF_ERROR(check_peer(*this, CollectiveOp::kSend, peer));
  MutexLock lock(group_.mutex);
  if (!group_.broken.ok()) return broken_status(CollectiveOp::kSend);
  if (bytes.empty()) return Status();
  Mailbox& box = group_.mailboxes[static_cast<size_t>(rank_) * group_.size + peer];
  FOLIO_CHECK(!box.posted, "rank {}: a second send to rank {} while one is pending", rank_, peer);
  box = Mailbox{.data = bytes.data(),
                .bytes = bytes.size(),
                .posted = true,
                .taken = false,
                .result = Status()};
  group_.changed.notify_all();
  lock.wait_until(group_.changed, Clock::now() + group_.timeout,
                  [&]() FOLIO_REQUIRES(group_.mutex) { return box.taken || !group_.broken.ok(); });
  const bool taken = box.taken;
  Status result = box.result;
  box = Mailbox{};  // withdrawn: the receiver never sees this pointer again
  if (taken && !result.ok()) {
    return Status(result.code(), fmt::format("rank {}: send of {} bytes to rank {} refused: {}",
                                             rank_, bytes.size(), peer, result.message()));
  }
  if (taken) return result;
  if (!group_.broken.ok()) return gave_up_status(CollectiveOp::kSend);
  const Status error = deadline_exceeded(
      "rank {}: rank {} did not receive {} bytes from rank {} within {} ms (slow, hung, or not "
      "calling recv)",
      rank_, peer, bytes.size(), rank_, group_.timeout.count());
  group_.break_group(error);
  return error;
}

Status InProcessMember::recv(std::span<std::byte> buffer, int peer) {
  FOLIO_RETURN_IF_ERROR(check_peer(*this, CollectiveOp::kRecv, peer));
  MutexLock lock(group_.mutex);
  if (!group_.broken.ok()) return broken_status(CollectiveOp::kRecv);
  if (buffer.empty()) return Status();
  Mailbox& box = group_.mailboxes[static_cast<size_t>(peer) * group_.size + rank_];
  const bool arrived = lock.wait_until(group_.changed, Clock::now() + group_.timeout,
                                       [&]() FOLIO_REQUIRES(group_.mutex) {
                                         return (box.posted && !box.taken) || !group_.broken.ok();
                                       });
  if (!group_.broken.ok()) return gave_up_status(CollectiveOp::kRecv);
  if (!arrived) {
    const Status error = deadline_exceeded(
        "rank {}: got no message of {} bytes from rank {} within {} ms (slow, hung, or not "
        "calling send)",
        rank_, buffer.size(), peer, group_.timeout.count());
    group_.break_group(error);
    return error;
  }
  box.taken = true;
  if (box.bytes != buffer.size()) {
    box.result = invalid_argument("rank {}: expected {} bytes from rank {}, which sent {}", rank_,
                                  buffer.size(), peer, box.bytes);
    group_.break_group(box.result);
    return box.result;
  }
  std::memcpy(buffer.data(), box.data, buffer.size());
  group_.changed.notify_all();
  return Status();
}

}  // namespace

Result<std::vector<std::unique_ptr<Collectives>>> make_in_process_group(
    int size, std::chrono::milliseconds timeout) {
  if (size < 1) return invalid_argument("an in-process group needs at least 1 rank, got {}", size);
  if (timeout.count() <= 0) {
    return invalid_argument("the group's timeout must be positive, got {} ms", timeout.count());
  }
  auto state = std::make_shared<GroupState>(size, timeout);
  std::vector<std::unique_ptr<Collectives>> members;
  members.reserve(size);
  for (int rank = 0; rank < size; ++rank) {
    members.push_back(std::make_unique<InProcessMember>(state, rank));
  }
  return members;
}

}  // namespace folio::dist

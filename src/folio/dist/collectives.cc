#include "folio/dist/collectives.h"

#include <functional>

namespace folio::dist {

std::string_view collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduceSum:
      return "all_reduce_sum";
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kSend:
      return "send";
    case CollectiveOp::kRecv:
      return "recv";
    case CollectiveOp::kBarrier:
      return "barrier";
  }
  return "unknown operation";
}

Status check_peer(const Collectives& member, CollectiveOp op, int peer) {
  if (peer < 0 || peer >= member.size()) {
    return invalid_argument("rank {}: {} names peer rank {}, outside the group of {} ranks (0..{})",
                            member.rank(), collective_op_name(op), peer, member.size(),
                            member.size() - 1);
  }
  if (peer == member.rank()) {
    return invalid_argument("rank {}: {} names itself as the peer; a rank cannot {} itself",
                            member.rank(), collective_op_name(op),
                            op == CollectiveOp::kSend ? "send to" : "receive from");
  }
  return Status();
}

Status check_root(const Collectives& member, int root) {
  if (root < 0 || root >= member.size()) {
    return invalid_argument("rank {}: broadcast from root rank {}, outside the group of {} ranks",
                            member.rank(), root, member.size());
  }
  return Status();
}

Status check_all_gather_sizes(const Collectives& member, size_t input_bytes, size_t output_bytes,
                              bool overlap) {
  const size_t expected = input_bytes * static_cast<size_t>(member.size());
  if (output_bytes != expected) {
    return invalid_argument(
        "rank {}: all_gather of {} bytes per rank needs an output of {} bytes ({} ranks), got {}",
        member.rank(), input_bytes, expected, member.size(), output_bytes);
  }
  if (overlap) {
    return invalid_argument("rank {}: all_gather input and output overlap; pass separate buffers",
                            member.rank());
  }
  return Status();
}

bool spans_overlap(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.empty() || b.empty()) return false;
  // std::less gives a total order on pointers into unrelated objects.
  const std::less<const std::byte*> before;
  return before(a.data(), b.data() + b.size()) && before(b.data(), a.data() + a.size());
}

}  // namespace folio::dist

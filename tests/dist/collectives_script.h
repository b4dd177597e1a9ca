// A fixed sequence of every operation, run by each member of a group: the same on threads and
// on processes (tests/dist/collectives_peer_main.cc). The transcript holds what must be
// bit-identical on every member (all_reduce_sum, all_gather and broadcast results, in order);
// what a member receives point to point is checked against the sender's seeded bytes here.
#pragma once

#include <cstring>
#include <vector>

#include "collectives_test_util.h"
#include "folio/base/status.h"
#include "folio/dist/collectives.h"

namespace folio::dist::testing {

inline const std::vector<size_t>& script_reduce_counts() {
  static const std::vector<size_t> counts = {0, 1, 7, 768, 4099, (size_t{1} << 20) + 3};
  return counts;
}

inline void append(std::vector<std::byte>& transcript, std::span<const std::byte> bytes) {
  transcript.insert(transcript.end(), bytes.begin(), bytes.end());
}

inline Status run_script(Collectives& member, std::vector<std::byte>& transcript) {
  const int rank = member.rank();
  const int size = member.size();
  for (size_t count : script_reduce_counts()) {
    std::vector<float> values = rank_values(rank, count);
    FOLIO_RETURN_IF_ERROR(member.all_reduce_sum(values));
    append(transcript, std::as_bytes(std::span<const float>(values)));
  }
  for (size_t bytes : {size_t{1}, size_t{13}, size_t{3072}}) {
    const std::vector<std::byte> input = rank_bytes(rank, bytes);
    std::vector<std::byte> output(bytes * size);
    FOLIO_RETURN_IF_ERROR(member.all_gather(input, output));
    append(transcript, output);
  }
  for (int root = 0; root < size; ++root) {
    std::vector<std::byte> buffer =
        rank == root ? rank_bytes(root, 1000, 3) : std::vector<std::byte>(1000, std::byte{0});
    FOLIO_RETURN_IF_ERROR(member.broadcast(buffer, root));
    append(transcript, buffer);
  }
  // A pipeline pass: each stage receives from the one before and sends to the one after,
  // three messages of different sizes.
  for (size_t bytes : {size_t{768 * 4}, size_t{1}, size_t{5000}}) {
    if (rank > 0) {
      std::vector<std::byte> received(bytes);
      FOLIO_RETURN_IF_ERROR(member.recv(received, rank - 1));
      if (received != rank_bytes(rank - 1, bytes, 5)) {
        return data_loss("rank {}: the {} bytes from rank {} differ from what it sent", rank, bytes,
                         rank - 1);
      }
    }
    if (rank + 1 < size) FOLIO_RETURN_IF_ERROR(member.send(rank_bytes(rank, bytes, 5), rank + 1));
  }
  return member.barrier();
}

}  // namespace folio::dist::testing

#include "folio/dist/gloo_collectives.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "folio/base/random.h"
#include "folio/dist/rendezvous_store.h"
#include "folio/dist/sigpipe.h"

namespace folio::dist {
namespace {

using Clock = std::chrono::steady_clock;

// Slot prefix of send/recv; gloo's own algorithms use 0x01..0x08.
constexpr uint8_t kPointToPointSlotPrefix = 0x40;

// The tag (part of gloo's slot) of a call: a hash of what the members must agree on, so calls
// that disagree never exchange messages (see the header).
uint32_t call_tag(CollectiveOp op, uint64_t bytes, int root) {
  SplitMix64 mix(bytes * 0x100000001b3ULL + static_cast<uint64_t>(op) * 131 +
                 static_cast<uint64_t>(root + 1));
  return static_cast<uint32_t>(mix.next() >> 32);
}

bool is_timeout(std::string_view message) {
  std::string lower(message);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("timeout") != std::string::npos || lower.find("timed out") != std::string::npos;
}

// The Status of a gloo exception thrown while this rank did `what`.
Status gloo_error(int rank, std::string_view what, std::chrono::milliseconds timeout, bool io_error,
                  std::string_view message) {
  if (is_timeout(message)) {
    return deadline_exceeded(
        "rank {}: {}: no answer within {} ms (a peer is slow, hung or gone, or called another "
        "operation or size): {}",
        rank, what, timeout.count(), message);
  }
  if (io_error) {
    return unavailable(
        "rank {}: {}: the connection to a peer failed (the peer is probably gone): {}", rank, what,
        message);
  }
  return internal_error("rank {}: {}: gloo failed: {}", rank, what, message);
}

// Runs body, turning every exception into a Status (gloo throws IoException, EnforceNotMet and
// std::system_error).
template <typename Body>
Status call_gloo(int rank, std::string_view what, std::chrono::milliseconds timeout, Body&& body) {
  try {
    body();
    return Status();
  } catch (const gloo::IoException& error) {
    return gloo_error(rank, what, timeout, true, error.what());
  } catch (const std::exception& error) {
    return gloo_error(rank, what, timeout, false, error.what());
  }
}

// gloo's FileStore with every wait bounded by the group's timeout, measured in milliseconds
// (FileStore's own wait counts whole seconds, and get() waits its 30 s default).
class BoundedFileStore final : public gloo::rendezvous::FileStore {
 public:
  BoundedFileStore(const std::string& path, std::chrono::milliseconds timeout)
      : FileStore(path), timeout_(timeout) {}

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto bound = std::min(timeout, timeout_);
    const auto deadline = Clock::now() + bound;
    while (!check(keys)) {
      if (Clock::now() >= deadline) {
        GLOO_THROW_IO_EXCEPTION("Wait timeout for key(s): ", gloo::MakeString(keys));
      }
      // A store on a file system has no notification that works on every file system (gloo
      // polls the same way).
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  bool has_key(const std::string& key) { return check({key}); }

 private:
  const std::chrono::milliseconds timeout_;
};

// The rendezvous store member 0's worker serves over gRPC (rendezvous_store.h): gloo's Store
// interface over RendezvousStoreClient, every wait bounded by the group's timeout and served on
// the worker (no polling). Errors become the exceptions gloo expects from a store: a timeout's
// message names the missing keys.
class GrpcStore final : public gloo::rendezvous::Store {
 public:
  GrpcStore(const std::string& address, const std::string& group_id, uint64_t epoch,
            std::chrono::milliseconds timeout)
      : client_(address, group_id, epoch), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    throw_if_error(client_.set(key, std::string(data.begin(), data.end()), timeout_));
  }

  std::vector<char> get(const std::string& key) override {
    Result<std::vector<std::string>> values = client_.wait({key}, timeout_, true);
    throw_if_error(values.status());
    return std::vector<char>(values->front().begin(), values->front().end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    throw_if_error(client_.wait(keys, std::min(timeout, timeout_), false).status());
  }

  bool has_key(const std::string& key) {
    return client_.wait({key}, std::chrono::milliseconds(0), false).ok();
  }

 private:
  static void throw_if_error(const Status& status) {
    if (status.ok()) return;
    if (status.code() == StatusCode::kDeadlineExceeded) {
      // "timeout": connect_gloo_group reads it as one (is_timeout) and names the missing ranks.
      GLOO_THROW_IO_EXCEPTION("timeout: ", status.message());
    }
    GLOO_THROW_IO_EXCEPTION(status.message());
  }

  RendezvousStoreClient client_;
  const std::chrono::milliseconds timeout_;
};

class GlooMember final : public Collectives {
 public:
  GlooMember(const GlooGroupOptions& options, std::shared_ptr<gloo::Context> context)
      : rank_(options.rank),
        size_(options.size),
        timeout_(options.timeout),
        context_(std::move(context)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  Status all_reduce_sum(std::span<float> values) override {
    const std::string what = fmt::format("all_reduce_sum of {} floats", values.size());
    return run(CollectiveOp::kAllReduceSum, values.empty(), what, [&] {
      gloo::AllreduceOptions options(context_);
      options.setOutput(values.data(), values.size());
      // out = local + received: the ring's order (see the header).
      options.setReduceFunction([](void* out, const void* a, const void* b, size_t count) {
        auto* sum = static_cast<float*>(out);
        const auto* x = static_cast<const float*>(a);
        const auto* y = static_cast<const float*>(b);
        for (size_t i = 0; i < count; ++i) sum[i] = x[i] + y[i];
      });
      options.setTag(call_tag(CollectiveOp::kAllReduceSum, values.size_bytes(), -1));
      options.setTimeout(timeout_);
      gloo::allreduce(options);
    });
  }

  Status all_gather(std::span<const std::byte> input, std::span<std::byte> output) override {
    FOLIO_RETURN_IF_ERROR(
        check_all_gather_sizes(*this, input.size(), output.size(), spans_overlap(input, output)));
    const std::string what = fmt::format("all_gather of {} bytes per rank", input.size());
    return run(CollectiveOp::kAllGather, input.empty(), what, [&] {
      gloo::AllgatherOptions options(context_);
      // gloo only reads the input; its setter takes a non-const pointer.
      options.setInput(const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(input.data())),
                       input.size());
      options.setOutput(reinterpret_cast<uint8_t*>(output.data()), output.size());
      options.setTag(call_tag(CollectiveOp::kAllGather, input.size(), -1));
      options.setTimeout(timeout_);
      gloo::allgather(options);
    });
  }

  Status broadcast(std::span<std::byte> buffer, int root) override {
    FOLIO_RETURN_IF_ERROR(check_root(*this, root));
    const std::string what = fmt::format("broadcast of {} bytes from root {}", buffer.size(), root);
    return run(CollectiveOp::kBroadcast, buffer.empty(), what, [&] {
      gloo::BroadcastOptions options(context_);
      options.setOutput(reinterpret_cast<uint8_t*>(buffer.data()), buffer.size());
      options.setRoot(root);
      options.setTag(call_tag(CollectiveOp::kBroadcast, buffer.size(), root));
      options.setTimeout(timeout_);
      gloo::broadcast(options);
    });
  }

  Status send(std::span<const std::byte> bytes, int peer) override {
    FOLIO_RETURN_IF_ERROR(check_peer(*this, CollectiveOp::kSend, peer));
    const std::string what = fmt::format("send of {} bytes to rank {}", bytes.size(), peer);
    return run(CollectiveOp::kSend, bytes.empty(), what, [&] {
      // gloo only reads a buffer it sends from.
      auto buffer =
          context_->createUnboundBuffer(const_cast<std::byte*>(bytes.data()), bytes.size());
      buffer->send(peer, point_to_point_slot(bytes.size()));
      if (!buffer->waitSend(timeout_)) GLOO_THROW("send was aborted");
    });
  }

  Status recv(std::span<std::byte> buffer, int peer) override {
    FOLIO_RETURN_IF_ERROR(check_peer(*this, CollectiveOp::kRecv, peer));
    const std::string what = fmt::format("recv of {} bytes from rank {}", buffer.size(), peer);
    return run(CollectiveOp::kRecv, buffer.empty(), what, [&] {
      auto unbound = context_->createUnboundBuffer(buffer.data(), buffer.size());
      unbound->recv(peer, point_to_point_slot(buffer.size()));
      if (!unbound->waitRecv(timeout_)) GLOO_THROW("recv was aborted");
    });
  }

  Status barrier() override {
    return run(CollectiveOp::kBarrier, false, "barrier", [&] {
      gloo::BarrierOptions options(context_);
      options.setTag(call_tag(CollectiveOp::kBarrier, 0, -1));
      options.setTimeout(timeout_);
      gloo::barrier(options);
    });
  }

 private:
  static uint64_t point_to_point_slot(size_t bytes) {
    return gloo::Slot::build(kPointToPointSlotPrefix, call_tag(CollectiveOp::kSend, bytes, -1));
  }

  // Refuses calls on a broken group; skips empty calls; breaks the group on any gloo error.
  template <typename Body>
  Status run(CollectiveOp op, bool empty, std::string_view what, Body&& body) {
    if (!broken_.ok()) {
      return failed_precondition("rank {}: {} on a broken group, which stays broken: {}", rank_,
                                 collective_op_name(op), broken_.to_string());
    }
    if (empty) return Status();
    Status status = call_gloo(rank_, what, timeout_, std::forward<Body>(body));
    if (!status.ok()) broken_ = status;
    return status;
  }

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;
  Status broken_;  // the first error; OK while the group is whole
};

Status check_options(const GlooGroupOptions& options) {
  if (options.size < 1) {
    return invalid_argument("a gloo group needs at least 1 rank, got size {}", options.size);
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return invalid_argument("rank {} is outside the group of {} ranks (0..{})", options.rank,
                            options.size, options.size - 1);
  }
  if (options.timeout.count() <= 0) {
    return invalid_argument("the group's timeout must be positive, got {} ms",
                            options.timeout.count());
  }
  const bool id_ok = !options.group_id.empty() &&
                     std::all_of(options.group_id.begin(), options.group_id.end(), [](char c) {
                       return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                              (c >= '0' && c <= '9') || c == '-' || c == '_';
                     });
  if (!id_ok) {
    return invalid_argument("group id '{}' must be non-empty letters, digits, '-' and '_'",
                            options.group_id);
  }
  if (options.store_directory.empty()) {
    if (options.store_address.empty()) {
      return invalid_argument(
          "group '{}' has no rendezvous store: give a directory every member reaches or the "
          "address of member 0's worker",
          options.group_id);
    }
    return Status();
  }
  std::error_code error;
  if (!std::filesystem::is_directory(options.store_directory, error)) {
    return not_found(
        "rendezvous directory '{}' does not exist; create it where every member of the group "
        "can reach it",
        options.store_directory);
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<Collectives>> connect_gloo_group(const GlooGroupOptions& options) {
  FOLIO_RETURN_IF_ERROR(check_options(options));
  ignore_sigpipe_once();
  const std::string prefix = fmt::format("folio.{}.{}", options.group_id, options.epoch);
  const bool over_grpc = options.store_directory.empty();
  const std::string what =
      fmt::format("joining group '{}' epoch {} ({} ranks, store {})", options.group_id,
                  options.epoch, options.size,
                  over_grpc ? fmt::format("served by member 0's worker {}", options.store_address)
                            : options.store_directory);
  // One of the two stores; has_key asks it whether a key is set (naming the missing ranks).
  std::unique_ptr<gloo::rendezvous::Store> base_store;
  std::function<bool(const std::string&)> has_key;
  std::shared_ptr<gloo::rendezvous::Context> context;
  bool io_error = false;
  std::string message;
  try {
    if (over_grpc) {
      auto grpc_store = std::make_unique<GrpcStore>(options.store_address, options.group_id,
                                                    options.epoch, options.timeout);
      has_key = [store = grpc_store.get()](const std::string& key) { return store->has_key(key); };
      base_store = std::move(grpc_store);
    } else {
      auto file_store =
          std::make_unique<BoundedFileStore>(options.store_directory, options.timeout);
      has_key = [store = file_store.get()](const std::string& key) { return store->has_key(key); };
      base_store = std::move(file_store);
    }
    gloo::rendezvous::PrefixStore store(prefix, *base_store);
    gloo::transport::tcp::attr attributes;
    attributes.hostname = options.host;
    auto device = gloo::transport::tcp::CreateDevice(attributes);
    context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(options.timeout);
    context->connectFullMesh(store, device);
    return std::unique_ptr<Collectives>(std::make_unique<GlooMember>(options, std::move(context)));
  } catch (const gloo::IoException& error) {
    io_error = true;
    message = error.what();
  } catch (const std::exception& error) {
    message = error.what();
  }
  if (message.find("already exists") != std::string::npos) {
    return failed_precondition(
        "rank {}: {}: this rank's address for this group and epoch is already in the store (a "
        "group is formed once per epoch): form it with a new epoch or a fresh store",
        options.rank, what);
  }
  if (is_timeout(message) && has_key) {
    // Which members never joined? Each sets gloo's key "rank_<rank>" first thing.
    std::vector<int> missing;
    try {
      for (int member = 0; member < options.size; ++member) {
        if (!has_key(fmt::format("{}/rank_{}", prefix, member))) {
          missing.push_back(member);
        }
      }
    } catch (const std::exception&) {
      missing.clear();
    }
    if (!missing.empty()) {
      return deadline_exceeded("rank {}: {}: rank{} {} did not join within {} ms", options.rank,
                               what, missing.size() == 1 ? "" : "s", fmt::join(missing, ", "),
                               options.timeout.count());
    }
  }
  return gloo_error(options.rank, what, options.timeout, io_error, message);
}

}  // namespace folio::dist

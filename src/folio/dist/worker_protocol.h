// The control plane's protocol revision and the identity of a model as the coordinator and its
// workers compare it. The wire schema is src/folio/dist/worker.proto (package folio.dist.v1);
// docs/design/dist.md states the versioning rule: the package carries the major version, and
// `kProtocolVersion` the revision within it, which must be equal on both sides of a handshake.
#pragma once

#include <cstdint>
#include <string>

namespace folio::dist {

// Bumped whenever a message of worker.proto changes meaning; a worker refuses a coordinator of
// another revision (and the coordinator a worker of another) instead of guessing.
// Revision 2 added the pipeline stage calls (PrepareStage, RunStage); revision 3 the recovery
// calls (epochs on the stage calls, Fence, Watch, Shutdown); revision 4 CopyBlocks (copy-on-write
// block copies in the stages' KV caches); revision 5 Ping payloads (the link's bandwidth);
// revision 6 the weight cache (OfferShard, PushTensors: a worker without the model file is sent
// its stage's tensors); revision 7 tensor-parallel ranks (PrepareStage's tensor_rank /
// tensor_ranks and gloo rendezvous, RunStage's communication figures); revision 8 KV-parallel
// members (PrepareStage's kv_member / kv_members / kv_tokens_per_member, RunStage's
// gathered_bytes); revision 9 the rendezvous store served over gRPC (StoreSet, StoreWait,
// PrepareStage's collective_store_address).
inline constexpr uint32_t kProtocolVersion = 9;

// The most bytes a Ping's reply may carry (PingRequest.reply_payload_bytes).
inline constexpr uint64_t kMaxPingPayloadBytes = uint64_t{64} << 20;

// The model a process holds, as the handshake compares it. `hash` is "fnv1a64:<16 hex digits>"
// of the model file's bytes (apps/folio computes it); empty when the process has no model.
struct ModelIdentity {
  std::string hash;
  std::string name;
};

}  // namespace folio::dist

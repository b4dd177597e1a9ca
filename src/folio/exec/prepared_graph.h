// PreparedGraph: an IR step graph checked and bound for the CPU kernels, ready to be executed
// eagerly or captured. Preparing does everything that can fail once, up front: every op is
// checked against what its kernel supports, weights and persistent inputs are bound (external
// addresses), KV-cache tensors are mapped to (layer, key or value) of the paged layout, each
// op's workspace is sized for the thread pool, and per-op constants (RoPE frequency factors) are
// computed. What is left, launch(), cannot fail: it turns one op and the addresses of its
// tensors into kernels::cpu launches on a HostStream (recorded instead of run while capturing).
//
// The launch of an op depends only on the bucket's shape and on addresses; every value that
// changes from step to step is read by the kernels through pointers into the persistent input
// buffers (DESIGN.md, "Graph arena invariants").
//
// Op -> kernel:
//   embedding -> embedding            rms_norm -> rms_norm        matmul -> matmul
//   add -> add                        swiglu -> silu_gate         gather_rows -> gather_rows
//   rope -> row copy into the output, then the rope body rotating it in place (query heads only)
//   kv_cache_write -> kv_write        paged_attention -> paged_attention
//   lora -> lora (its row of the adapter table, read at run time)
//   geglu -> gelu_gate                scale -> scale              soft_cap -> soft_cap
//   all_reduce_sum -> a one-item launch calling StepCollectives::all_reduce_sum on the output
//   (the input copied there first unless they share memory), its failure recorded in the
//   context's CollectiveFailures (step_collectives.h)
//   attention_merge (KV-parallel) -> one item packing the member's partial and log-sum-exps
//     into the op's workspace and all_gathering them over the step collectives, then
//     attention_merge over the gathered parts (kernels/cpu/attention_merge.h)
//   mul, silu: no CPU kernel yet; preparing a graph with them fails (kInvalidArgument naming
//   the op).
// Activations must be f32 (the CPU kernels' type); KV caches f32 or f16.
//
// Thread-safety: immutable after prepare(); launch() may run from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "folio/base/result.h"
#include "folio/device/host_stream.h"
#include "folio/exec/host_buffer.h"
#include "folio/exec/op_profile.h"
#include "folio/exec/persistent_inputs.h"
#include "folio/exec/step_collectives.h"
#include "folio/exec/tensor_binding.h"
#include "folio/ir/graph.h"
#include "folio/kernels/cpu/paged_attention.h"

namespace folio::exec {

// Static data of one op, fixed when the graph is prepared.
struct PreparedOp {
  const ir::Op* op = nullptr;
  int64_t workspace_bytes = 0;  // scratch one launch needs (all threads), 64-byte multiple
  int32_t kv_layer = -1;        // kv_cache_write, paged_attention
  const float* rope_frequency_factors = nullptr;  // f32 [rotary_dim / 2], or null
  float rope_position_scale = 1.0f;
  float rope_magnitude_scale = 1.0f;                     // YaRN's scale of cosines and sines
  const int32_t* gather_row_count = nullptr;             // i32 scalar the gather reads at run time
  const kernels::LoraSlotWeights* lora_slots = nullptr;  // lora: its row of the adapter table
  ProfileRow profile_row = ProfileRow::kOtherOps;        // its launches' tag (op_profile.h)
};

struct PrepareContext {
  const ir::WeightSource& weights;
  const KvCacheBinding& kv_cache;
  const PersistentInputs& inputs;
  // The adapter table; required (non-null slots) when the graph has lora ops.
  AdapterTableBinding adapters;
  int num_threads = 1;  // of the pool the graph will run on (sizes per-thread workspaces)
  // The group the graph's collective ops talk to, and where their launches record a failure;
  // required (both non-null) when the graph has collective ops. Not owned; must outlive the
  // prepared graph.
  StepCollectives* collectives = nullptr;
  CollectiveFailures* collective_failures = nullptr;
};

// The graph's program order (op ids 0, 1, ...): the order every mode executes ops in.
std::vector<ir::OpId> program_order(const ir::Graph& graph);

class PreparedGraph {
 public:
  // Errors (kInvalidArgument unless the weight source says otherwise) name the op or tensor:
  // an op without a CPU kernel, a non-f32 activation, a weight missing or of another dtype or
  // shape, an input that is not a persistent input or does not fit it, a KV cache that does not
  // match the paged layout, a matmul whose input features are not a multiple of 32.
  static Result<std::unique_ptr<PreparedGraph>> prepare(ir::Graph graph,
                                                        const PrepareContext& context);

  const ir::Graph& graph() const { return graph_; }
  // In program order: ops()[i] is graph().ops()[i].
  std::span<const PreparedOp> ops() const { return ops_; }
  // The data of every weight and persistent input, indexed by tensor id; null elsewhere.
  std::span<std::byte* const> external_addresses() const { return external_addresses_; }
  int num_threads() const { return num_threads_; }
  const PersistentInputs& inputs() const { return inputs_; }

  // Launches op `index` onto `stream`, its launches tagged with the op's profile row.
  // Requires: addresses[t] is the data of every tensor t the op reads or writes (activations
  // and outputs included; f32, row-major, 64-byte aligned); `workspace` holds
  // ops()[index].workspace_bytes bytes, 64-byte aligned; stream.pool().num_threads() ==
  // num_threads().
  void launch(size_t index, std::span<std::byte* const> addresses, std::byte* workspace,
              device::HostStream& stream) const;

  // The arguments of the paged attention op `index` (what launch() would launch).
  // Requires: ops()[index] is a paged attention; the rest as launch().
  kernels::cpu::PagedAttentionArguments attention_arguments(size_t index,
                                                            std::span<std::byte* const> addresses,
                                                            std::byte* workspace) const;

 private:
  PreparedGraph(ir::Graph graph, const PrepareContext& context);
  Status bind_externals(const PrepareContext& context);
  Status prepare_op(size_t index);
  Status prepare_matmul(PreparedOp& prepared);
  Status prepare_rope(PreparedOp& prepared);
  Status prepare_gather(PreparedOp& prepared);
  Status prepare_lora(PreparedOp& prepared);
  Status prepare_attention_merge(PreparedOp& prepared);

  ir::Graph graph_;
  const KvCacheBinding kv_cache_;
  const AdapterTableBinding adapters_;
  const PersistentInputs& inputs_;
  const int num_threads_;
  StepCollectives* const collectives_;
  CollectiveFailures* const collective_failures_;
  std::vector<PreparedOp> ops_;
  std::vector<std::byte*> external_addresses_;
  std::vector<KvCacheRef> kv_refs_;
  std::vector<HostBuffer> constants_;  // RoPE factors, gather counts; addresses stable
};

}  // namespace folio::exec

// PreparedGraph::launch: one IR op -> kernels::cpu launches.
#include <cstring>
#include <limits>

#include "folio/exec/prepared_graph.h"
#include "folio/kernels/cpu/activation.h"
#include "folio/kernels/cpu/add.h"
#include "folio/kernels/cpu/attention_merge.h"
#include "folio/kernels/cpu/embedding.h"
#include "folio/kernels/cpu/gather_rows.h"
#include "folio/kernels/cpu/kv_write.h"
#include "folio/kernels/cpu/lora.h"
#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/rms_norm.h"
#include "folio/kernels/cpu/rope.h"
#include "folio/kernels/cpu/work_partition.h"

namespace folio::exec {
namespace {

// Copies rows of bytes: the out-of-place half of RoPE (the kernel rotates in place).
struct CopyRowsArguments {
  const std::byte* source;  // bytes [num_rows, row_bytes]
  std::byte* destination;   // bytes [num_rows, row_bytes]; must not overlap source
  int64_t row_bytes = 0;
};

void copy_rows_body(const CopyRowsArguments& arguments, int64_t begin, int64_t end,
                    int /*thread_index*/) {
  std::memcpy(arguments.destination + begin * arguments.row_bytes,
              arguments.source + begin * arguments.row_bytes,
              static_cast<size_t>((end - begin) * arguments.row_bytes));
}

// Launch helpers see the op's tensors through this.
class OpOperands {
 public:
  OpOperands(const ir::Graph& graph, const ir::Op& op, std::span<std::byte* const> addresses)
      : graph_(graph), op_(op), addresses_(addresses) {}

  const ir::TensorInfo& input(int position) const {
    return graph_.tensor(op_.inputs[static_cast<size_t>(position)]);
  }
  const ir::TensorInfo& output() const { return graph_.tensor(op_.outputs[0]); }
  template <typename T>
  T* input_data(int position) const {
    return data<T>(op_.inputs[static_cast<size_t>(position)]);
  }
  float* output_data() const { return data<float>(op_.outputs[0]); }

 private:
  template <typename T>
  T* data(ir::TensorId id) const {
    std::byte* address = addresses_[static_cast<size_t>(id.value())];
    FOLIO_DCHECK(address != nullptr, "tensor '{}' has no address", graph_.tensor(id).name);
    return reinterpret_cast<T*>(address);
  }

  const ir::Graph& graph_;
  const ir::Op& op_;
  std::span<std::byte* const> addresses_;
};

void launch_embedding(const OpOperands& operands, device::HostStream& stream) {
  const ir::TensorInfo& table = operands.input(ir::embedding_input::kTable);
  kernels::EmbeddingArguments arguments;
  arguments.token_ids = operands.input_data<const int32_t>(ir::embedding_input::kTokenIds);
  arguments.table = operands.input_data<const void>(ir::embedding_input::kTable);
  arguments.output = operands.output_data();
  arguments.num_tokens = operands.output().shape[0];
  arguments.vocab_size = table.shape[0];
  arguments.hidden = table.shape[1];
  arguments.table_dtype = table.dtype;
  kernels::cpu::embedding(stream, arguments);
}

void launch_rms_norm(const OpOperands& operands, const ir::Op& op, device::HostStream& stream) {
  const ir::TensorInfo& x = operands.input(ir::rms_norm_input::kX);
  kernels::cpu::RmsNormArguments arguments;
  arguments.input = operands.input_data<const float>(ir::rms_norm_input::kX);
  arguments.weight = operands.input_data<const float>(ir::rms_norm_input::kWeight);
  arguments.output = operands.output_data();
  // Groups of the weight's length are rows of their own (per-head norms): the rows are
  // contiguous either way.
  const int64_t group = operands.input(ir::rms_norm_input::kWeight).shape[0];
  arguments.num_rows = x.shape[0] * (x.shape[1] / group);
  arguments.hidden = group;
  arguments.epsilon = std::get<ir::RmsNormAttributes>(op.attributes).epsilon;
  kernels::cpu::rms_norm(stream, arguments);
}

void launch_add(const OpOperands& operands, device::HostStream& stream) {
  kernels::cpu::AddArguments arguments;
  arguments.a = operands.input_data<const float>(0);
  arguments.b = operands.input_data<const float>(1);
  arguments.output = operands.output_data();
  arguments.num_elements = operands.output().shape.num_elements();
  kernels::cpu::add(stream, arguments);
}

void launch_swiglu(const OpOperands& operands, device::HostStream& stream) {
  const ir::TensorInfo& gate = operands.input(0);
  kernels::cpu::SiluGateArguments arguments;
  arguments.gate = operands.input_data<const float>(0);
  arguments.up = operands.input_data<const float>(1);
  arguments.output = operands.output_data();
  arguments.gate_row_stride = arguments.up_row_stride = arguments.output_row_stride = gate.shape[1];
  arguments.num_rows = gate.shape[0];
  arguments.width = gate.shape[1];
  kernels::cpu::silu_gate(stream, arguments);
}

void launch_geglu(const OpOperands& operands, device::HostStream& stream) {
  kernels::cpu::GeluGateArguments arguments;
  arguments.gate = operands.input_data<const float>(0);
  arguments.up = operands.input_data<const float>(1);
  arguments.output = operands.output_data();
  arguments.num_elements = operands.output().shape.num_elements();
  kernels::cpu::gelu_gate(stream, arguments);
}

void launch_scale(const OpOperands& operands, const ir::Op& op, device::HostStream& stream) {
  kernels::cpu::ScaleArguments arguments;
  arguments.input = operands.input_data<const float>(0);
  arguments.output = operands.output_data();
  arguments.num_elements = operands.output().shape.num_elements();
  arguments.factor = std::get<ir::ScaleAttributes>(op.attributes).factor;
  kernels::cpu::scale(stream, arguments);
}

void launch_soft_cap(const OpOperands& operands, const ir::Op& op, device::HostStream& stream) {
  kernels::cpu::SoftCapArguments arguments;
  arguments.input = operands.input_data<const float>(0);
  arguments.output = operands.output_data();
  arguments.num_elements = operands.output().shape.num_elements();
  arguments.cap = std::get<ir::SoftCapAttributes>(op.attributes).cap;
  kernels::cpu::soft_cap(stream, arguments);
}

// One item: the collective runs on one pool thread, as a member of its group calls it once.
struct AllReduceArguments {
  StepCollectives* collectives;
  CollectiveFailures* failures;
  const float* input;
  float* output;
  int64_t num_elements = 0;
};

void all_reduce_body(const AllReduceArguments& arguments, int64_t /*begin*/, int64_t /*end*/,
                     int /*thread_index*/) {
  if (arguments.input != arguments.output) {
    std::memcpy(arguments.output, arguments.input,
                static_cast<size_t>(arguments.num_elements) * sizeof(float));
  }
  // After a failure the group is broken: its later calls would only fail again.
  if (arguments.failures->any()) return;
  Status status = arguments.collectives->all_reduce_sum(
      std::span<float>(arguments.output, static_cast<size_t>(arguments.num_elements)));
  if (!status.ok()) arguments.failures->record(std::move(status));
}

void launch_all_reduce(const OpOperands& operands, StepCollectives* collectives,
                       CollectiveFailures* failures, device::HostStream& stream) {
  const AllReduceArguments arguments{collectives, failures, operands.input_data<const float>(0),
                                     operands.output_data(),
                                     operands.output().shape.num_elements()};
  stream.launch(device::HostKernel::make<AllReduceArguments, all_reduce_body>("all_reduce_sum",
                                                                              arguments, 1));
}

void launch_matmul(const OpOperands& operands, const PreparedOp& prepared, std::byte* workspace,
                   device::HostStream& stream) {
  const ir::TensorInfo& x = operands.input(ir::matmul_input::kX);
  const ir::TensorInfo& weight = operands.input(ir::matmul_input::kWeight);
  kernels::MatmulArguments arguments;
  arguments.input = operands.input_data<const float>(ir::matmul_input::kX);
  arguments.weight = operands.input_data<const void>(ir::matmul_input::kWeight);
  if (prepared.op->inputs.size() > 2) {
    arguments.bias = operands.input_data<const float>(ir::matmul_input::kBias);
  }
  arguments.output = operands.output_data();
  arguments.workspace = workspace;
  arguments.workspace_bytes = prepared.workspace_bytes;
  arguments.num_rows = x.shape[0];
  arguments.input_features = x.shape[1];
  arguments.output_features = weight.shape[0];
  arguments.weight_dtype = weight.dtype;
  kernels::cpu::matmul(stream, arguments);
}

void launch_rope(const OpOperands& operands, const PreparedOp& prepared,
                 device::HostStream& stream) {
  const ir::TensorInfo& x = operands.input(ir::rope_input::kX);
  const auto& attributes = std::get<ir::RopeAttributes>(prepared.op->attributes);
  const int64_t row_bytes = x.shape[1] * static_cast<int64_t>(sizeof(float));
  float* output = operands.output_data();
  const CopyRowsArguments copy{operands.input_data<const std::byte>(ir::rope_input::kX),
                               reinterpret_cast<std::byte*>(output), row_bytes};
  stream.launch(device::HostKernel::make<CopyRowsArguments, &copy_rows_body>(
      "rope_copy", copy, x.shape[0], kernels::cpu::grain_for(row_bytes / 4)));
  // The IR ropes one tensor per op; the kernel ropes a query and a key tensor per launch.
  // Launching its body with no key heads rotates the query alone (the launch function insists
  // on at least one key head, so the body is launched directly, with the same partition).
  kernels::cpu::RopeArguments arguments;
  arguments.query = output;
  arguments.key = output;  // never dereferenced: num_kv_heads == 0
  arguments.query_row_stride = x.shape[1];
  arguments.key_row_stride = x.shape[1];
  arguments.positions = operands.input_data<const int32_t>(ir::rope_input::kPositions);
  // A frequency factor operand (GGUF's rope_freqs) is a weight; llama3 and yarn scaling
  // computed theirs when the graph was prepared (the op signature allows one or the other).
  arguments.frequency_factors =
      prepared.op->inputs.size() > ir::rope_input::kFrequencyFactors
          ? operands.input_data<const float>(ir::rope_input::kFrequencyFactors)
          : prepared.rope_frequency_factors;
  arguments.num_tokens = x.shape[0];
  arguments.num_heads = static_cast<int32_t>(attributes.num_heads);
  arguments.num_kv_heads = 0;
  arguments.head_dim = static_cast<int32_t>(attributes.head_dim);
  arguments.rotary_dim = static_cast<int32_t>(attributes.rotary_dim);
  arguments.style = attributes.style == kernels::RopeStyle::kNeox ? kernels::RopeStyle::kNeox
                                                                  : kernels::RopeStyle::kNormal;
  arguments.theta_base = attributes.theta;
  arguments.position_scale = prepared.rope_position_scale;
  arguments.magnitude_scale = prepared.rope_magnitude_scale;
  const int64_t elements_per_token = attributes.num_heads * attributes.rotary_dim;
  stream.launch(device::HostKernel::make<kernels::cpu::RopeArguments, &kernels::cpu::rope_body>(
      "rope", arguments, arguments.num_tokens, kernels::cpu::grain_for(4 * elements_per_token)));
}

void launch_kv_write(const OpOperands& operands, const PreparedOp& prepared,
                     const kernels::PagedKvLayout& layout, device::HostStream& stream) {
  const ir::TensorInfo& key = operands.input(ir::kv_cache_write_input::kKey);
  kernels::cpu::KvWriteArguments arguments;
  arguments.key = operands.input_data<const float>(ir::kv_cache_write_input::kKey);
  arguments.value = operands.input_data<const float>(ir::kv_cache_write_input::kValue);
  arguments.key_row_stride = key.shape[1];
  arguments.value_row_stride = key.shape[1];
  arguments.slot_mapping =
      operands.input_data<const int32_t>(ir::kv_cache_write_input::kSlotMapping);
  arguments.cache = layout;
  arguments.layer = prepared.kv_layer;
  arguments.num_tokens = key.shape[0];
  kernels::cpu::kv_write(stream, arguments);
}

void launch_gather(const OpOperands& operands, const PreparedOp& prepared,
                   device::HostStream& stream) {
  const ir::TensorInfo& x = operands.input(ir::gather_rows_input::kX);
  kernels::cpu::GatherRowsArguments arguments;
  arguments.source = operands.input_data<const std::byte>(ir::gather_rows_input::kX);
  arguments.destination = reinterpret_cast<std::byte*>(operands.output_data());
  arguments.row_indices = operands.input_data<const int32_t>(ir::gather_rows_input::kIndices);
  arguments.num_rows = prepared.gather_row_count;
  arguments.num_source_rows = x.shape[0];
  arguments.max_rows = operands.output().shape[0];
  arguments.row_bytes = x.shape[1] * static_cast<int64_t>(sizeof(float));
  kernels::cpu::gather_rows(stream, arguments);
}

void launch_lora(const OpOperands& operands, const PreparedOp& prepared,
                 const AdapterTableBinding& adapters, std::byte* workspace,
                 device::HostStream& stream) {
  const ir::TensorInfo& x = operands.input(ir::lora_input::kX);
  kernels::LoraArguments arguments;
  arguments.input = operands.input_data<const float>(ir::lora_input::kX);
  arguments.base = operands.input_data<const float>(ir::lora_input::kBase);
  arguments.output = operands.output_data();
  arguments.token_slots = operands.input_data<const int32_t>(ir::lora_input::kTokenAdapterSlots);
  arguments.slots = prepared.lora_slots;
  arguments.num_slots = adapters.num_slots;
  arguments.max_rank = adapters.max_rank;
  arguments.workspace = workspace;
  arguments.workspace_bytes = prepared.workspace_bytes;
  arguments.num_rows = x.shape[0];
  arguments.input_features = x.shape[1];
  arguments.output_features = operands.output().shape[1];
  kernels::cpu::lora(stream, arguments);
}

// A KV-parallel member's exchange (dist.md "KV-parallel groups"): packs its partial output and
// log-sum-exps into one buffer and all_gathers every member's. One work item: the collective is
// called once per launch, from one thread. A failed gather is recorded for the executor to
// return, and the gathered buffer is made neutral (every log-sum-exp -inf) so the merge that
// follows writes zeros rather than reading what a broken exchange left.
struct GatherPartialsArguments {
  const float* partial;  // f32 [T, heads * head_dim]
  const float* lse;      // f32 [T, heads]
  float* packed;         // f32 [part]: partial, then lse
  float* gathered;       // f32 [members, part]
  int64_t output_elements = 0;
  int64_t lse_elements = 0;
  int32_t num_members = 0;
  StepCollectives* collectives;
  CollectiveFailures* failures;
};

void gather_partials_body(const GatherPartialsArguments& arguments, int64_t /*begin*/,
                          int64_t /*end*/, int /*thread_index*/) {
  const int64_t part = arguments.output_elements + arguments.lse_elements;
  std::memcpy(arguments.packed, arguments.partial,
              static_cast<size_t>(arguments.output_elements) * sizeof(float));
  std::memcpy(arguments.packed + arguments.output_elements, arguments.lse,
              static_cast<size_t>(arguments.lse_elements) * sizeof(float));
  // After a failure the group is broken: its later calls would only fail again.
  if (!arguments.failures->any()) {
    Status status = arguments.collectives->all_gather(
        std::span<const float>(arguments.packed, static_cast<size_t>(part)),
        std::span<float>(arguments.gathered, static_cast<size_t>(part * arguments.num_members)));
    if (status.ok()) return;
    arguments.failures->record(status.with_context("KV-parallel attention merge"));
  }
  for (int32_t member = 0; member < arguments.num_members; ++member) {
    float* lse = arguments.gathered + member * part + arguments.output_elements;
    std::fill(lse, lse + arguments.lse_elements, -std::numeric_limits<float>::infinity());
  }
}

void launch_attention_merge(const OpOperands& operands, const PreparedOp& prepared,
                            StepCollectives& collectives, CollectiveFailures& failures,
                            std::byte* workspace, device::HostStream& stream) {
  const ir::TensorInfo& partial = operands.input(ir::attention_merge_input::kPartial);
  const ir::TensorInfo& lse = operands.input(ir::attention_merge_input::kLse);
  const int64_t heads = lse.shape[1];
  const int64_t part = partial.shape.num_elements() + lse.shape.num_elements();
  auto* packed = reinterpret_cast<float*>(workspace);
  FOLIO_DCHECK((1 + collectives.size()) * part * int64_t{sizeof(float)} <= prepared.workspace_bytes,
               "attention_merge workspace of {} bytes", prepared.workspace_bytes);
  const GatherPartialsArguments gather{
      .partial = operands.input_data<const float>(ir::attention_merge_input::kPartial),
      .lse = operands.input_data<const float>(ir::attention_merge_input::kLse),
      .packed = packed,
      .gathered = packed + part,
      .output_elements = partial.shape.num_elements(),
      .lse_elements = lse.shape.num_elements(),
      .num_members = collectives.size(),
      .collectives = &collectives,
      .failures = &failures};
  // The exchange is communication in the profile; the merge is attention, as the op's row.
  stream.set_launch_tag(static_cast<int32_t>(ProfileRow::kCommunication));
  stream.launch(device::HostKernel::make<GatherPartialsArguments, &gather_partials_body>(
      "attention_gather", gather, 1, 1));
  stream.set_launch_tag(static_cast<int32_t>(prepared.profile_row));
  kernels::cpu::attention_merge(stream,
                                kernels::cpu::AttentionMergeArguments{
                                    .partials = packed + part,
                                    .output = operands.output_data(),
                                    .lse = nullptr,
                                    .num_parts = collectives.size(),
                                    .num_tokens = static_cast<int32_t>(partial.shape[0]),
                                    .num_heads = static_cast<int32_t>(heads),
                                    .head_dim = static_cast<int32_t>(partial.shape[1] / heads)});
}

}  // namespace

kernels::cpu::PagedAttentionArguments PreparedGraph::attention_arguments(
    size_t index, std::span<std::byte* const> addresses, std::byte* workspace) const {
  const PreparedOp& prepared = ops_[index];
  FOLIO_CHECK(prepared.op->kind == ir::OpKind::kPagedAttention, "op {} is not attention", index);
  const OpOperands operands(graph_, *prepared.op, addresses);
  const auto& attributes = std::get<ir::AttentionAttributes>(prepared.op->attributes);
  const ir::TensorInfo& query = operands.input(ir::attention_input::kQuery);
  const ir::TensorInfo& tables = operands.input(ir::attention_input::kBlockTables);
  kernels::cpu::PagedAttentionArguments arguments{};
  arguments.query = operands.input_data<const float>(ir::attention_input::kQuery);
  arguments.output = operands.output_data();
  arguments.query_row_stride = query.shape[1];
  arguments.cache = kv_cache_.layout;
  arguments.layer = prepared.kv_layer;
  arguments.num_tokens = static_cast<int32_t>(query.shape[0]);
  arguments.num_heads = static_cast<int32_t>(attributes.num_heads);
  arguments.max_sequences = static_cast<int32_t>(tables.shape[0]);
  arguments.max_blocks_per_sequence = static_cast<int32_t>(tables.shape[1]);
  arguments.scale = attributes.scale;
  arguments.sliding_window = static_cast<int32_t>(attributes.sliding_window);
  arguments.logit_soft_cap = attributes.logit_soft_cap;
  arguments.num_sequences = inputs_.num_sequences();
  arguments.query_start = operands.input_data<const int32_t>(ir::attention_input::kQueryStartLoc);
  arguments.seq_lens = operands.input_data<const int32_t>(ir::attention_input::kSeqLens);
  arguments.block_tables = operands.input_data<const int32_t>(ir::attention_input::kBlockTables);
  arguments.positions = inputs_.positions();
  arguments.workspace = workspace;
  arguments.workspace_threads = num_threads_;
  if (attributes.is_kv_parallel()) {  // a KV-parallel member's partial, with its log-sum-exp
    arguments.kv_range_begin = attributes.kv_range_begin;
    arguments.kv_range_end = attributes.kv_range_end;
    arguments.lse = reinterpret_cast<float*>(
        addresses[static_cast<size_t>(prepared.op->outputs[ir::attention_output::kLse].value())]);
  }
  return arguments;
}

void PreparedGraph::launch(size_t index, std::span<std::byte* const> addresses,
                           std::byte* workspace, device::HostStream& stream) const {
  FOLIO_DCHECK(stream.pool().num_threads() == num_threads_,
               "graph prepared for {} threads launched on a pool of {}", num_threads_,
               stream.pool().num_threads());
  const PreparedOp& prepared = ops_[index];
  const ir::Op& op = *prepared.op;
  const OpOperands operands(graph_, op, addresses);
  stream.set_launch_tag(static_cast<int32_t>(prepared.profile_row));
  switch (op.kind) {
    case ir::OpKind::kEmbedding:
      launch_embedding(operands, stream);
      return;
    case ir::OpKind::kRmsNorm:
      launch_rms_norm(operands, op, stream);
      return;
    case ir::OpKind::kMatMul:
      launch_matmul(operands, prepared, workspace, stream);
      return;
    case ir::OpKind::kAdd:
      launch_add(operands, stream);
      return;
    case ir::OpKind::kSwiGlu:
      launch_swiglu(operands, stream);
      return;
    case ir::OpKind::kGeGlu:
      launch_geglu(operands, stream);
      return;
    case ir::OpKind::kScale:
      launch_scale(operands, op, stream);
      return;
    case ir::OpKind::kSoftCap:
      launch_soft_cap(operands, op, stream);
      return;
    case ir::OpKind::kAllReduceSum:
      launch_all_reduce(operands, collectives_, collective_failures_, stream);
      return;
    case ir::OpKind::kRope:
      launch_rope(operands, prepared, stream);
      return;
    case ir::OpKind::kKvCacheWrite:
      launch_kv_write(operands, prepared, kv_cache_.layout, stream);
      return;
    case ir::OpKind::kPagedAttention:
      kernels::cpu::paged_attention(stream, attention_arguments(index, addresses, workspace));
      return;
    case ir::OpKind::kGatherRows:
      launch_gather(operands, prepared, stream);
      return;
    case ir::OpKind::kLora:
      launch_lora(operands, prepared, adapters_, workspace, stream);
      return;
    case ir::OpKind::kAttentionMerge:
      launch_attention_merge(operands, prepared, *collectives_, *collective_failures_, workspace,
                             stream);
      return;
    case ir::OpKind::kMul:
    case ir::OpKind::kSilu:
      break;
  }
  FOLIO_CHECK(false, "{} '{}' was not prepared for a CPU kernel", ir::op_kind_name(op.kind),
              op.name);
}

}  // namespace folio::exec

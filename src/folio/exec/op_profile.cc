#include "folio/exec/op_profile.h"

#include <algorithm>
#include <string>

namespace folio::exec {
namespace {

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// Matmuls by the weight they multiply, as model/llama_graph.cc names them ("blk.<i>.attn_q.
// weight", "output.weight"; a tied LM head multiplies "token_embd.weight").
ProfileRow matmul_row(std::string_view weight) {
  if (contains(weight, ".attn_q.") || contains(weight, ".attn_k.") ||
      contains(weight, ".attn_v.") || contains(weight, ".attn_qkv.")) {
    return ProfileRow::kMatmulQkv;
  }
  if (contains(weight, ".attn_output.")) return ProfileRow::kMatmulAttentionOutput;
  if (contains(weight, ".ffn_gate") || contains(weight, ".ffn_up")) {
    return ProfileRow::kMatmulFfnGateUp;
  }
  if (contains(weight, ".ffn_down.")) return ProfileRow::kMatmulFfnDown;
  if (weight == "output.weight" || weight == "token_embd.weight") return ProfileRow::kMatmulLmHead;
  return ProfileRow::kMatmulOther;
}

}  // namespace

std::string_view profile_row_name(ProfileRow row) {
  switch (row) {
    case ProfileRow::kMatmulQkv:
      return "matmul_qkv";
    case ProfileRow::kMatmulAttentionOutput:
      return "matmul_attention_output";
    case ProfileRow::kMatmulFfnGateUp:
      return "matmul_ffn_gate_up";
    case ProfileRow::kMatmulFfnDown:
      return "matmul_ffn_down";
    case ProfileRow::kMatmulLmHead:
      return "matmul_lm_head";
    case ProfileRow::kMatmulOther:
      return "matmul_other";
    case ProfileRow::kAttention:
      return "attention";
    case ProfileRow::kRmsNorm:
      return "rms_norm";
    case ProfileRow::kRope:
      return "rope";
    case ProfileRow::kActivation:
      return "activation";
    case ProfileRow::kEmbedding:
      return "embedding";
    case ProfileRow::kKvWrite:
      return "kv_write";
    case ProfileRow::kAdd:
      return "add";
    case ProfileRow::kGatherRows:
      return "gather_rows";
    case ProfileRow::kLora:
      return "lora";
    case ProfileRow::kCommunication:
      return "communication";
    case ProfileRow::kOtherOps:
      return "other_ops";
    case ProfileRow::kThreadWait:
      return "thread_wait";
    case ProfileRow::kInputPreparation:
      return "input_preparation";
    case ProfileRow::kGraphCapture:
      return "graph_capture";
    case ProfileRow::kStepBuilding:
      return "step_building";
    case ProfileRow::kSampling:
      return "sampling";
  }
  return "?";
}

std::string_view profile_phase_name(ProfilePhase phase) {
  switch (phase) {
    case ProfilePhase::kDecode:
      return "decode";
    case ProfilePhase::kPrefill:
      return "prefill";
  }
  return "?";
}

ProfileRow profile_row_of(const ir::Graph& graph, const ir::Op& op) {
  switch (op.kind) {
    case ir::OpKind::kMatMul:
      return matmul_row(
          graph.tensor(op.inputs[static_cast<size_t>(ir::matmul_input::kWeight)]).name);
    case ir::OpKind::kPagedAttention:
    case ir::OpKind::kAttentionMerge:  // KV-parallel: the exchange and merge of partials
      return ProfileRow::kAttention;
    case ir::OpKind::kRmsNorm:
      return ProfileRow::kRmsNorm;
    case ir::OpKind::kRope:
      return ProfileRow::kRope;
    case ir::OpKind::kSwiGlu:
    case ir::OpKind::kGeGlu:
    case ir::OpKind::kSilu:
      return ProfileRow::kActivation;
    case ir::OpKind::kEmbedding:
      return ProfileRow::kEmbedding;
    case ir::OpKind::kKvCacheWrite:
      return ProfileRow::kKvWrite;
    case ir::OpKind::kAdd:
      return ProfileRow::kAdd;
    case ir::OpKind::kGatherRows:
      return ProfileRow::kGatherRows;
    case ir::OpKind::kLora:
      return ProfileRow::kLora;
    case ir::OpKind::kMul:
    case ir::OpKind::kScale:
    case ir::OpKind::kSoftCap:
      return ProfileRow::kOtherOps;
    case ir::OpKind::kAllReduceSum:
      return ProfileRow::kCommunication;
  }
  return ProfileRow::kOtherOps;
}

double ProfileTimes::total_seconds() const {
  double total = 0;
  for (double value : seconds) total += value;
  return total;
}

void ProfileTimes::add(const ProfileTimes& other) {
  for (size_t row = 0; row < seconds.size(); ++row) {
    seconds[row] += other.seconds[row];
    calls[row] += other.calls[row];
  }
}

double PhaseProfile::other_seconds() const {
  return std::max(0.0, step_seconds - rows.total_seconds());
}

void OpProfile::end_step(ProfilePhase phase, double step_seconds) {
  PhaseProfile& totals = phases_[static_cast<size_t>(phase)];
  ++totals.steps;
  totals.step_seconds += step_seconds;
  totals.rows.add(current_);
  current_ = ProfileTimes{};
}

void OpProfile::reset() {
  current_ = ProfileTimes{};
  phases_ = {};
}

void OpProfile::on_kernel(const device::HostKernel& kernel, const device::KernelTiming& timing) {
  const ProfileRow row = kernel.tag >= 0 && kernel.tag < kNumProfileRows
                             ? static_cast<ProfileRow>(kernel.tag)
                             : ProfileRow::kOtherOps;
  // The op's share of the wall time is the threads' average busy time; the rest the pool's
  // threads spent idle while the kernel ran.
  const double busy = std::min(timing.wall_seconds, timing.busy_seconds / timing.num_threads);
  add(row, busy, kernel.first_of_tag ? 1 : 0);
  add(ProfileRow::kThreadWait, timing.wall_seconds - busy, 0);
}

}  // namespace folio::exec

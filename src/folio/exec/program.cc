#include "folio/exec/program.h"

#include <chrono>

#include "folio/exec/eager_runner.h"
#include "folio/ir/buffer_plan.h"
#include "folio/ir/lifetime.h"
#include "folio/ir/split.h"

namespace folio::exec {
namespace {

std::byte* planned_address(const ir::BufferPlan& plan, const ArenaView& view, ir::TensorId id) {
  const ir::BufferAssignment* assignment = plan.find(id);
  if (assignment == nullptr) return nullptr;
  FOLIO_CHECK(static_cast<size_t>(assignment->offset + assignment->size) <= view.bytes,
              "planned slot [{}, {}) outside the arena view of {} bytes", assignment->offset,
              assignment->offset + assignment->size, view.bytes);
  return view.base + assignment->offset;
}

}  // namespace

void AttentionRunner::run(device::HostStream& stream) const {
  stream.set_launch_tag(static_cast<int32_t>(ProfileRow::kAttention));
  kernels::cpu::paged_attention(stream, arguments_);
}

void Program::replay(device::HostStream& stream, const ArenaReplayLock& lock) const {
  FOLIO_CHECK(lock.arena() == arena_,
              "program replayed under the replay lock of another arena; replays sharing physical "
              "memory must be serialized by their own arena's lock");
  for (const Instruction& instruction : instructions_) {
    switch (instruction.kind) {
      case InstructionKind::kGraph:
        stream.replay(pieces_[static_cast<size_t>(instruction.index)]);
        break;
      case InstructionKind::kAttention:
        runners_[static_cast<size_t>(instruction.index)].run(stream);
        break;
    }
  }
}

int64_t Program::num_captured_kernels() const {
  int64_t kernels = 0;
  for (const device::HostGraph& piece : pieces_)
    kernels += static_cast<int64_t>(piece.num_kernels());
  return kernels;
}

Result<std::vector<std::byte*>> Program::bind(const ir::BufferPlan& plan,
                                              std::span<std::byte* const> output_addresses,
                                              MultiShapeArena& arena) {
  const ir::Graph& ir_graph = graph_->graph();
  addresses_.assign(graph_->external_addresses().begin(), graph_->external_addresses().end());
  for (const ir::TensorInfo& tensor : ir_graph.tensors()) {
    if (tensor.residency != ir::Residency::kOutput) continue;
    const auto index = static_cast<size_t>(tensor.id.value());
    if (index >= output_addresses.size() || output_addresses[index] == nullptr) {
      return invalid_argument("output '{}' has no persistent buffer to capture into", tensor.name);
    }
    addresses_[index] = output_addresses[index];
  }
  FOLIO_ASSIGN_OR_RETURN(view_, arena.create_view(static_cast<size_t>(plan.peak_bytes)));
  arena_ = &arena;
  planned_bytes_ = plan.peak_bytes;
  for (const ir::TensorInfo& tensor : ir_graph.tensors()) {
    if (tensor.residency != ir::Residency::kActivation) continue;
    addresses_[static_cast<size_t>(tensor.id.value())] = planned_address(plan, view_, tensor.id);
  }
  std::vector<std::byte*> workspaces(static_cast<size_t>(ir_graph.num_ops()), nullptr);
  for (size_t position = 0; position < workspaces.size(); ++position) {
    const ir::TensorId scratch(ir_graph.num_tensors() + static_cast<int32_t>(position));
    workspaces[position] = planned_address(plan, view_, scratch);
  }
  return workspaces;
}

void Program::record_piece(std::span<const ir::OpId> ops, std::span<std::byte* const> workspaces,
                           AttentionCaptureHook* attention_hook, device::HostStream& stream) {
  stream.begin_capture();
  for (ir::OpId op : ops) {
    const auto index = static_cast<size_t>(op.value());
    if (attention_hook != nullptr && graph_->graph().op(op).kind == ir::OpKind::kPagedAttention) {
      kernels::cpu::PagedAttentionArguments arguments =
          graph_->attention_arguments(index, addresses_, workspaces[index]);
      attention_hook->on_capture(arguments);
      stream.set_launch_tag(static_cast<int32_t>(ProfileRow::kAttention));
      kernels::cpu::paged_attention(stream, arguments);
      continue;
    }
    graph_->launch(index, addresses_, workspaces[index], stream);
  }
  device::HostGraph piece = stream.end_capture();
  if (piece.empty()) return;  // two attention ops in a row leave an empty piece
  instructions_.push_back({InstructionKind::kGraph, static_cast<int32_t>(pieces_.size())});
  pieces_.push_back(std::move(piece));
}

void Program::record(std::span<std::byte* const> workspaces, AttentionCaptureHook* attention_hook,
                     device::HostStream& stream) {
  const std::vector<ir::OpId> order = program_order(graph_->graph());
  switch (kind_) {
    case ProgramKind::kFullGraph:
      record_piece(order, workspaces, attention_hook, stream);
      return;
    case ProgramKind::kPiecewise:
      break;
  }
  const ir::PiecewiseSplit split = ir::split_at_attention(graph_->graph(), order);
  for (const ir::Segment& segment : split.segments) {
    if (segment.kind == ir::SegmentKind::kPiece) {
      record_piece(segment.ops, workspaces, attention_hook, stream);
      continue;
    }
    for (ir::OpId op : segment.ops) {
      const auto index = static_cast<size_t>(op.value());
      kernels::cpu::PagedAttentionArguments arguments =
          graph_->attention_arguments(index, addresses_, workspaces[index]);
      if (attention_hook != nullptr) attention_hook->on_capture(arguments);
      instructions_.push_back({InstructionKind::kAttention, static_cast<int32_t>(runners_.size())});
      runners_.emplace_back(arguments);
    }
  }
}

Result<std::unique_ptr<Program>> capture_program(std::unique_ptr<PreparedGraph> graph,
                                                 MultiShapeArena& arena,
                                                 std::span<std::byte* const> output_addresses,
                                                 device::HostStream& stream,
                                                 const CaptureOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  FOLIO_ASSIGN_OR_RETURN(const ir::BufferPlan plan, plan_step_activations(*graph));
  std::unique_ptr<Program> program(new Program());
  program->kind_ = options.kind;
  program->graph_ = std::move(graph);
  FOLIO_ASSIGN_OR_RETURN(const std::vector<std::byte*> workspaces,
                         program->bind(plan, output_addresses, arena));
  program->record(workspaces, options.attention_hook, stream);
  program->capture_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return program;
}

}  // namespace folio::exec

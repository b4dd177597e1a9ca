// Program: what a bucket replays (seed 000 §1 and §3, seed 004 "Piecewise CUDA Graphs").
//
// capture_program() turns a prepared step graph into a program:
//   1. plans the activations, and every op's workspace, into one arena with the ir/ lifetime
//      planner (a workspace is a scratch "tensor" live only at its op's position);
//   2. takes a fresh view of the multi-shape arena of the planned size;
//   3. binds every tensor to an address: activations and workspaces inside the view, outputs to
//      the persistent output buffers, weights and inputs as prepared;
//   4. records the launches of every op on the stream while it captures:
//      - kFullGraph (decode-only steps): one captured graph of every op, attention included;
//      - kPiecewise (steps with prefill): the ir/ split at attention ops; each piece between
//        attention ops is one captured graph, each attention op an AttentionRunner that is
//        launched eagerly at replay with the step's current lengths, writing in place into the
//        arena slot the previous piece left its input in and the next piece reads.
// The program is one instruction list (graph, attention, graph, ...) replayed in order, with no
// allocation, no shape inference and no graph building.
//
// Capturing runs no kernel: HostStream records launches (as a CUDA stream capture does), so a
// bucket can be captured before any step of its size arrives.
//
// Thread-safety: immutable after capture; replay() requires the arena's replay lock, which
// serializes every program of one arena.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "folio/base/result.h"
#include "folio/device/host_stream.h"
#include "folio/exec/attention_capture_hook.h"
#include "folio/exec/multi_shape_arena.h"
#include "folio/exec/prepared_graph.h"
#include "folio/ir/buffer_plan.h"
#include "folio/kernels/cpu/paged_attention.h"

namespace folio::exec {

enum class ProgramKind : uint8_t { kFullGraph, kPiecewise };

// One attention op of a piecewise program, run eagerly between graph pieces. Its arguments are
// fixed at capture except what the kernel reads through pointers at run time (the number of
// sequences, query starts, context lengths, block tables, positions), so each launch sees the
// current step. (On CPU the kernel's partition depends only on the padded token count; a CUDA
// runner would size its grid from the step here.)
class AttentionRunner {
 public:
  explicit AttentionRunner(const kernels::cpu::PagedAttentionArguments& arguments)
      : arguments_(arguments) {}
  void run(device::HostStream& stream) const;
  const kernels::cpu::PagedAttentionArguments& arguments() const { return arguments_; }

 private:
  kernels::cpu::PagedAttentionArguments arguments_;
};

struct CaptureOptions {
  ProgramKind kind = ProgramKind::kFullGraph;
  // Fault injection for tests (attention_capture_hook.h): sees, and may rewrite, the arguments
  // of every paged-attention launch captured. Null in the product; must outlive the program.
  AttentionCaptureHook* attention_hook = nullptr;
};

class Program {
 public:
  enum class InstructionKind : uint8_t { kGraph, kAttention };
  struct Instruction {
    InstructionKind kind = InstructionKind::kGraph;
    int32_t index = 0;  // into the pieces or the runners
  };

  // Runs every instruction in order on `stream`.
  // Requires: `lock` was taken on the arena this program was captured in.
  void replay(device::HostStream& stream, const ArenaReplayLock& lock) const;

  ProgramKind kind() const { return kind_; }
  const PreparedGraph& graph() const { return *graph_; }
  const ArenaView& view() const { return view_; }
  // Bytes the planner asked for (the view is this rounded up to the arena's granule).
  int64_t planned_bytes() const { return planned_bytes_; }
  double capture_seconds() const { return capture_seconds_; }
  std::span<const Instruction> instructions() const { return instructions_; }
  int32_t num_pieces() const { return static_cast<int32_t>(pieces_.size()); }
  int32_t num_attention_runners() const { return static_cast<int32_t>(runners_.size()); }
  int64_t num_captured_kernels() const;
  // The address bound to every tensor at capture, by tensor id (null for KV caches).
  std::span<std::byte* const> addresses() const { return addresses_; }

 private:
  friend Result<std::unique_ptr<Program>> capture_program(std::unique_ptr<PreparedGraph>,
                                                          MultiShapeArena&,
                                                          std::span<std::byte* const>,
                                                          device::HostStream&,
                                                          const CaptureOptions&);
  Program() = default;
  // Binds every tensor (activations into a fresh view of `arena`) and returns each op's
  // workspace address, by op id.
  Result<std::vector<std::byte*>> bind(const ir::BufferPlan& plan,
                                       std::span<std::byte* const> output_addresses,
                                       MultiShapeArena& arena);
  // Records the instruction list of kind_.
  void record(std::span<std::byte* const> workspaces, AttentionCaptureHook* attention_hook,
              device::HostStream& stream);
  void record_piece(std::span<const ir::OpId> ops, std::span<std::byte* const> workspaces,
                    AttentionCaptureHook* attention_hook, device::HostStream& stream);

  ProgramKind kind_ = ProgramKind::kFullGraph;
  std::unique_ptr<PreparedGraph> graph_;
  const MultiShapeArena* arena_ = nullptr;
  ArenaView view_;
  int64_t planned_bytes_ = 0;
  double capture_seconds_ = 0;
  std::vector<std::byte*> addresses_;
  std::vector<device::HostGraph> pieces_;
  std::vector<AttentionRunner> runners_;
  std::vector<Instruction> instructions_;
};

// Captures `graph` into a program on a fresh view of `arena` (see the file comment).
// output_addresses[t] is the persistent buffer of every output tensor t (indexed by tensor id;
// each at least the tensor's bytes). Errors: the arena's (no memory for the view). Requires:
// `stream` is not capturing and its pool has graph->num_threads() threads.
Result<std::unique_ptr<Program>> capture_program(std::unique_ptr<PreparedGraph> graph,
                                                 MultiShapeArena& arena,
                                                 std::span<std::byte* const> output_addresses,
                                                 device::HostStream& stream,
                                                 const CaptureOptions& options);

}  // namespace folio::exec

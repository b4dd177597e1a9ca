// Annotations: the semantic metadata every IR tensor and op carries (seed 002 §2.3), so the
// executor, the memory planner and a scheduler can act on what a value *is* rather than on its
// bytes alone.
//
// - Residency (per tensor): where the value lives and who owns its memory. Only activations are
//   planned into the step's arena; everything else is bound to memory outside it.
// - Phase (per op): the engine phase the step graph was emitted for.
// - Modality (per op): the kind of data; text only today.
// - CostHints (per op): FLOPs and bytes read / written, computed from shapes and dtypes when the
//   op is created (cost.h gives the formula of each op kind).
#pragma once

#include <cstdint>
#include <string_view>

namespace folio::ir {

enum class Residency : uint8_t {
  kWeight,      // model parameter, bound by name to external (mmap'd or device) memory
  kActivation,  // intermediate value of one step, planned into the arena; dead after its last use
  kKvCache,     // paged KV cache of one layer; external state that ops update in place
  kInput,       // persistent input buffer written by the executor before each step (token ids,
                // positions, slot mapping, block tables, sequence lengths, ...)
  kOutput,      // persistent output buffer the caller reads after the step (logits)
};

enum class Phase : uint8_t {
  kPrefill,  // every sequence of the step is (a chunk of) a prompt
  kDecode,   // every sequence of the step contributes one new token
  kMixed,    // prefill chunks and decode tokens in one step
};

enum class Modality : uint8_t {
  kText,
};

// Estimates, not measurements: a scheduler compares them, nothing depends on them for
// correctness. Bytes count every operand once (no cache model).
struct CostHints {
  int64_t flops = 0;
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  // Bytes a collective op hands to the group (its payload per member; a ring all-reduce over n
  // members sends about 2 (n - 1) / n of it): what crosses the wire, for placement.
  int64_t bytes_communicated = 0;

  CostHints& operator+=(const CostHints& other) {
    flops += other.flops;
    bytes_read += other.bytes_read;
    bytes_written += other.bytes_written;
    bytes_communicated += other.bytes_communicated;
    return *this;
  }
  // FLOPs per byte moved; 0 when nothing is moved.
  double arithmetic_intensity() const;

  friend bool operator==(const CostHints&, const CostHints&) = default;
};

std::string_view residency_name(Residency residency);
std::string_view phase_name(Phase phase);
std::string_view modality_name(Modality modality);

// True for residencies whose memory the executor plans into the step's arena.
constexpr bool is_arena_planned(Residency residency) {
  return residency == Residency::kActivation;
}
// True for residencies bound to memory the graph does not own (the executor binds them by name).
constexpr bool is_external(Residency residency) {
  switch (residency) {
    case Residency::kWeight:
    case Residency::kKvCache:
    case Residency::kInput:
      return true;
    case Residency::kActivation:
    case Residency::kOutput:
      return false;
  }
  return false;
}

}  // namespace folio::ir

// CPU LoRA: launches the per-token low-rank adapter update of kernels/lora.h (multi-adapter BGMV)
// onto a HostStream:
//   output[t, :] = base[t, :] + scale_a * B_a (A_a x[t, :])   for a = token_slots[t], rank_a > 0
//   output[t, :] = base[t, :]                                  otherwise
//
// How the work is done:
// - Work items are tokens. An item reads its slot, then shrinks (rank dot products of x with the
//   rows of A: low_rank[j] = scale * dot(A[j, :], x)) into its thread's workspace slice, then
//   expands (output = base + sum_j low_rank[j] * B^T[j, :], a fused multiply-add per j, in j
//   order, columns in register tiles). A token's update is small (rank * (K + N) multiply-adds,
//   1/24 of the base projection's at rank 16 and K = N = 768), so a token is never split over
//   threads: every part would have to repeat its shrink.
// - f16 and int8 matrices are read in place, widened to f32 in registers (int8: value * its
//   block's f32 scale, the same f32 product read_lora_value computes); nothing is dequantized to
//   a temporary.
// - Per instruction set (SimdLevel, read once at launch and stored in it): AVX-512 (16 lanes,
//   masked tails), AVX2 + FMA + F16C (8 lanes), portable (8-lane arrays, multiply then add). The
//   loops are written once (lora_body.inc) and compiled per instruction set (lora_<level>.cc).
//
// Determinism: every output element is computed inside one item, by a sequence of operations
// fixed by (format, rank, K, N, SimdLevel): the other tokens of the batch, the thread count and
// the partition never change a bit (batch invariance, tested).
#pragma once

#include <cstdint>

#include "folio/device/host_stream.h"
#include "folio/kernels/lora.h"

namespace folio::kernels::cpu {

// Workspace bytes `lora` needs on a pool of `num_threads` threads: one 64-byte aligned slice of
// max_rank floats per thread (the token's low-rank vector); 0 when max_rank is 0.
// Requires: max_rank >= 0, num_threads >= 1.
int64_t lora_workspace_bytes(int32_t max_rank, int num_threads);

// Launches the update. Requires (checked at launch: a violation is an engine bug fixed for a
// captured graph, so it aborts): num_rows >= 0, input_features > 0, output_features >= 0,
// max_rank >= 0, num_slots >= 1 and non-null pointers when there is work; workspace 64-byte
// aligned with workspace_bytes >= lora_workspace_bytes(max_rank, stream.pool().num_threads());
// output either equal to base or disjoint from it, and disjoint from input and workspace.
// Requires at run time (checked per token, since token_slots and the slot table are rewritten
// between replays and a bad value would read or write outside a buffer): each token_slots[t] in
// [0, num_slots), each used slot's rank in [0, max_rank], its a and b non-null when rank > 0.
void lora(device::HostStream& stream, const LoraArguments& arguments);

}  // namespace folio::kernels::cpu

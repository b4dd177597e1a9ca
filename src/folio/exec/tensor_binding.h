// Tensor binding: how the tensors of an IR step graph find their memory.
//
// - Weights are bound by name through an ir::WeightSource (ir/step_graph.h), which the model
//   layer implements over the tensors of an mmapped GGUF file (tests implement it over random
//   weights in memory); ir::bind_weight checks dtype and shape.
// - KV caches: the IR has a key and a value cache tensor per layer, [blocks, block_size,
//   kv_heads, head_dim]; the kernels have one paged block layout holding every layer's K and V
//   (kernels/paged_kv_layout.h). A cache tensor maps to (layer, key or value) by the op that
//   uses it: its `layer` and the operand position (kv_cache_write updates and paged_attention
//   inputs list the key cache before the value cache). Every use must agree.
// - lora ops read row LoraAttributes::target of the adapter table (AdapterTableBinding).
// - Persistent inputs are bound by name to PersistentInputs (persistent_inputs.h).
// - Activations and outputs are bound per execution: by the eager runner as it goes, or to
//   arena offsets and persistent output buffers at capture.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "folio/base/result.h"
#include "folio/ir/graph.h"
#include "folio/ir/step_graph.h"
#include "folio/kernels/lora.h"
#include "folio/kernels/paged_kv_layout.h"
#include "folio/tensor/tensor_view.h"

namespace folio::exec {

// The KV cache the executor writes and attends over.
struct KvCacheBinding {
  kernels::PagedKvLayout layout;
  int64_t num_blocks = 0;  // blocks allocated behind layout.base
  // The model layer held as the layout's layer 0: a pipeline stage's cache holds only its
  // layers [first_layer, first_layer + layout.num_layers), while its graph's ops keep their
  // absolute layer indices. 0 for a whole model.
  int32_t first_layer = 0;
};

// The adapter table the graphs' lora ops read (kernels/lora.h): num_targets rows (one per
// projection an adapter may update, indexed by the op's LoraAttributes::target) of num_slots
// entries, row-major. Whoever owns it rewrites the entries between steps (never during one);
// the pointer stays fixed, so captured programs see new adapters without recapture.
struct AdapterTableBinding {
  const kernels::LoraSlotWeights* slots = nullptr;  // null: no table (graphs without lora ops)
  int32_t num_targets = 0;
  int32_t num_slots = 0;
  int32_t max_rank = 0;  // of any adapter the table will hold (sizes the kernels' workspace)
};

// Where one IR KV-cache tensor lives in the paged layout.
struct KvCacheRef {
  int32_t layer = -1;  // the layout's layer (the op's layer minus the binding's first_layer)
  bool is_value = false;
};

// The KvCacheRef of every tensor of `graph` (indexed by tensor id; layer -1 for tensors that
// are not KV caches). Errors: a cache used by an op without a layer index, with a layer outside
// the layout's [first_layer, first_layer + num_layers), as both key and value or by two layers, or
// whose dtype or shape differs from [num_blocks, block_size, num_kv_heads, head_dim] of the
// binding.
Result<std::vector<KvCacheRef>> map_kv_caches(const ir::Graph& graph,
                                              const KvCacheBinding& binding);

}  // namespace folio::exec

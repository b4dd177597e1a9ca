// PipelineStage: one stage of a pipeline-parallel model, as a worker runs it (issue 15, slice 3):
// layers [first_layer, end_layer) of a model through exec/'s executor, over a page pool of its
// own (the stage's memory budget) holding a KV cache of those layers only, its persistent
// buffers and its activations (captured programs in a graph arena on the pool, or eager steps).
//
// The coordinator keeps the scheduler and the block tables: the stage's KV cache has the
// coordinator's num_kv_blocks blocks, so the block ids and slots of every step mean the same
// in every stage. A step is the coordinator's ir::StepBatch plus the residual stream entering
// the stage (none for the first); it returns the residual stream leaving it, or the logits
// from the last stage (exec/executor.h).
//
// Thread-safety: none; one thread at a time (the worker service serializes its steps).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/base/thread_pool.h"
#include "folio/device/virtual_memory.h"
#include "folio/dist/collectives.h"
#include "folio/dist/timed_step_collectives.h"
#include "folio/engine/model_engine.h"
#include "folio/exec/executor.h"
#include "folio/exec/multi_shape_arena.h"
#include "folio/kv/kv_types.h"
#include "folio/memory/page_pool.h"
#include "folio/model/llama_model.h"
#include "folio/model/llama_tensor_shard.h"

namespace folio::dist {

// What a coordinator asks a worker to prepare (worker.proto's PrepareStageRequest).
struct PipelineStageSpec {
  int64_t first_layer = 0;
  int64_t end_layer = 0;
  int64_t num_kv_blocks = 0;  // the coordinator's block ids, padding blocks included
  int32_t block_size = 16;
  int32_t max_blocks_per_sequence = 0;
  DType kv_dtype = DType::kF16;
  int64_t first_dummy_block = 0;
  int32_t num_dummy_blocks = 1;
  std::vector<int32_t> bucket_ladder = exec::BucketPolicy::default_ladder();
  int32_t max_num_tokens = 0;  // 0: the largest bucket
  int32_t max_sequences = 0;
  int32_t max_logit_rows = 0;  // 0: max_sequences
  bool use_graphs = true;
  int64_t pool_bytes = 0;  // the stage's page pool: KV cache, persistent buffers, activations
  // Tensor parallelism (issue 15, slice 4): the stage is rank `tensor_rank` of `tensor_ranks`
  // (model/llama_tensor_split.h) and runs its share of every layer of [first_layer,
  // end_layer) (the whole model: tensor and pipeline splits do not combine yet), its KV cache
  // holding its KV heads only. 1: no tensor split.
  int64_t tensor_rank = 0;
  int64_t tensor_ranks = 1;
  // The ranks' gloo group (worker.proto PrepareStageRequest): its rendezvous directory, group id
  // and the bound of forming it and of every collective. The worker forms it; PipelineStage is
  // handed the formed group.
  std::string collective_store;
  // Without a directory: the address of member 0's worker, whose rendezvous store (served over
  // gRPC, rendezvous_store.h) every member uses. StageGroup sets it when both are empty.
  std::string collective_store_address;
  std::string collective_group_id = "folio-tp";
  std::chrono::milliseconds collective_timeout{30000};
  // KV-parallel groups (issue 15, slice 6; dist.md "KV-parallel groups"): the stage is member
  // `kv_member` of `kv_members` and runs every layer with its KV cache holding positions
  // [kv_member * kv_tokens_per_member, (kv_member + 1) * kv_tokens_per_member) of every sequence
  // (a multiple of block_size); each layer's attention is merged with the other members' over
  // the group (model LlamaGraphOptions::kv_range_*). The block ids, limits and block table width
  // are the coordinator's, as for any stage. 1: no KV split. Not combined with tensor_ranks > 1.
  int64_t kv_member = 0;
  int64_t kv_members = 1;
  int64_t kv_tokens_per_member = 0;

  // Whether the stage is one member of a worker group (tensor ranks or KV-parallel members)
  // and so runs over a Collectives group: its rank and size in it.
  bool in_group() const { return tensor_ranks > 1 || kv_members > 1; }
  int64_t group_rank() const { return kv_members > 1 ? kv_member : tensor_rank; }
  int64_t group_size() const { return kv_members > 1 ? kv_members : tensor_ranks; }
  // "tensor rank 1 of 2", "KV-parallel member 0 of 2" or "stage of layers [0, 4)".
  std::string describe() const;
};

// The spec of layers [first_layer, end_layer) of the coordinator's engine whose step arrays
// `setup` describes (the same block ids, buckets and limits on every stage), with a pool of
// `pool_bytes`.
PipelineStageSpec pipeline_stage_spec(const engine::RemoteStepSetup& setup, int64_t first_layer,
                                      int64_t end_layer, int64_t pool_bytes);

class PipelineStage {
 public:
  // Builds the stage over `model` (which must outlive it) with `num_threads` compute threads.
  // Errors: a malformed spec (kInvalidArgument), a pool too small for the KV cache and the
  // executor's buffers (kResourceExhausted), and the executor's.
  static Result<std::unique_ptr<PipelineStage>> create(const model::LlamaModel& model,
                                                       const PipelineStageSpec& spec,
                                                       int num_threads);
  // A tensor-parallel rank (spec.tensor_ranks > 1) or KV-parallel member (spec.kv_members > 1)
  // over `group`, its member of the group (its rank and size must be the spec's group_rank()
  // and group_size()), which the stage owns: its all_reduce_sum (ranks) or all_gather (members)
  // ops run through it. For a rank, `model` `model` must have been opened without q8_0 panels
  // (LlamaLoadOptions::pack_q8_0_panels = false): the stage copies its shard of the split
  // matrices out of it (model/llama_tensor_shard.h) and packs those itself. Errors: as above,
  // an illegal split (kInvalidArgument), a group of another rank or size (kInvalidArgument);
  // for a member, a range not of whole blocks, a partial layer range or a tensor split too
  // (kInvalidArgument).
  static Result<std::unique_ptr<PipelineStage>> create(const model::LlamaModel& model,
                                                       const PipelineStageSpec& spec,
                                                       int num_threads,
                                                       std::unique_ptr<Collectives> group);
  ~PipelineStage();
  PipelineStage(const PipelineStage&) = delete;
  PipelineStage& operator=(const PipelineStage&) = delete;

  // One step (exec::Executor::execute): the output's spans are valid until the next run().
  Result<ir::StepOutput> run(const ir::StepBatch& step, std::span<const float> hidden_in);
  // Copy-on-write copies in the stage's KV cache: each pair's destination block gets the
  // source block's K and V of every layer the stage holds (the coordinator's block ids).
  // kInvalidArgument, copying nothing, when a block id is outside [0, num_kv_blocks), a block
  // is both a source and a destination, or a destination repeats (kv/block_copier.h's batch
  // rule, which lets the pairs be copied in any order).
  Status copy_blocks(std::span<const kv::BlockCopy> copies);

  const PipelineStageSpec& spec() const { return spec_; }
  int64_t hidden_input_size() const { return executor_->hidden_input_size(); }
  int64_t hidden_output_size() const { return executor_->hidden_output_size(); }
  // Logits columns; 0 for a stage that is not the last.
  int32_t vocab_size() const;
  // Bytes of the weights the stage's graphs read (each tensor once, whole).
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t kv_cache_bytes() const { return kv_cache_bytes_; }
  // The time and bytes of the stage's collectives so far (zero without a tensor split).
  CommunicationStats communication() const;

 private:
  PipelineStage() = default;

  // Declared in construction order; destroyed in reverse.
  PipelineStageSpec spec_;
  // Worker groups only: the group and the executor's view of it; a tensor rank's weights.
  std::unique_ptr<Collectives> group_;
  std::unique_ptr<exec::StepCollectives> group_steps_;
  std::unique_ptr<TimedStepCollectives> timed_collectives_;
  std::unique_ptr<model::LlamaTensorShard> shard_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<device::VirtualMemory> virtual_memory_;
  std::unique_ptr<memory::PagePool> pool_;
  memory::PageAllocation kv_memory_;
  kv::KvLayoutNumbers kv_layout_;  // the KV cache of the stage's layers, in kv_memory_
  std::unique_ptr<exec::MultiShapeArena> arena_;
  std::unique_ptr<exec::Executor> executor_;
  int64_t weight_bytes_ = 0;
  int64_t kv_cache_bytes_ = 0;
};

// Whether `copies` is a batch a stage of `num_kv_blocks` blocks copies: every id in
// [0, num_kv_blocks), no block both a source and a destination, no destination twice
// (kv/block_copier.h's rule). kInvalidArgument naming the first offending block otherwise.
Status check_block_copies(std::span<const kv::BlockCopy> copies, int64_t num_kv_blocks);

// The weight bytes layers [first_layer, end_layer) of `model` hold (their step graph's weights,
// each once, whole; of tensor rank `split`'s graph when split): what a worker must have room
// for besides the stage's pool.
Result<int64_t> llama_stage_weight_bytes(const model::LlamaShape& model, int64_t first_layer,
                                         int64_t end_layer,
                                         const model::LlamaTensorSplit& split = {});

}  // namespace folio::dist

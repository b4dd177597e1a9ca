#include "folio/dist/pipeline_stage.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "folio/device/host_virtual_memory.h"
#include "folio/dist/group_step_collectives.h"
#include "folio/exec/arena_memory.h"
#include "folio/exec/step_memory.h"
#include "folio/model/llama_graph.h"

namespace folio::dist {
namespace {

// Pool pages of the stage: the engine's page size (engine/model_engine.h), smaller for pools
// too small to hold a few of them.
constexpr int64_t kPageBytes = int64_t{2} << 20;
constexpr int64_t kSmallPageBytes = int64_t{64} << 10;

Status check_spec(const model::LlamaShape& shape, const PipelineStageSpec& spec) {
  if (spec.first_layer < 0 || spec.first_layer >= spec.end_layer ||
      spec.end_layer > shape.num_layers) {
    return invalid_argument("stage layers [{}, {}) are not a non-empty range of the model's {}",
                            spec.first_layer, spec.end_layer, shape.num_layers);
  }
  if (spec.kv_dtype != DType::kF32 && spec.kv_dtype != DType::kF16) {
    return invalid_argument("the KV cache holds f32 or f16, not {}", dtype_name(spec.kv_dtype));
  }
  if (spec.num_kv_blocks <= 0 || spec.block_size <= 0 || spec.max_blocks_per_sequence <= 0) {
    return invalid_argument(
        "a stage needs KV blocks ({}), a block size ({}) and block-table columns ({})",
        spec.num_kv_blocks, spec.block_size, spec.max_blocks_per_sequence);
  }
  if (spec.pool_bytes <= 0) {
    return invalid_argument("the stage's pool needs bytes, got {}", spec.pool_bytes);
  }
  if (spec.kv_members > 1) {
    if (spec.kv_member < 0 || spec.kv_member >= spec.kv_members) {
      return invalid_argument("KV-parallel member {} is not one of the group's {}", spec.kv_member,
                              spec.kv_members);
    }
    if (spec.kv_tokens_per_member <= 0 || spec.kv_tokens_per_member % spec.block_size != 0) {
      return invalid_argument(
          "a KV-parallel member holds a range of whole blocks: {} tokens per member is not a "
          "positive multiple of the block size {}",
          spec.kv_tokens_per_member, spec.block_size);
    }
    if (spec.tensor_ranks > 1) {
      return invalid_argument(
          "KV-parallel member {} of {} cannot also be tensor rank {} of {}: KV-parallel groups "
          "and tensor splits do not combine yet",
          spec.kv_member, spec.kv_members, spec.tensor_rank, spec.tensor_ranks);
    }
    if (spec.first_layer != 0 || spec.end_layer != shape.num_layers) {
      return invalid_argument(
          "a KV-parallel member runs every layer (KV-parallel groups and pipeline stages do not "
          "combine yet), not layers [{}, {})",
          spec.first_layer, spec.end_layer);
    }
  }
  return Status();
}

}  // namespace

std::string PipelineStageSpec::describe() const {
  if (kv_members > 1) return fmt::format("KV-parallel member {} of {}", kv_member, kv_members);
  if (tensor_ranks > 1) return fmt::format("tensor rank {} of {}", tensor_rank, tensor_ranks);
  return fmt::format("stage of layers [{}, {})", first_layer, end_layer);
}

Result<int64_t> llama_stage_weight_bytes(const model::LlamaShape& model, int64_t first_layer,
                                         int64_t end_layer, const model::LlamaTensorSplit& split) {
  model::LlamaGraphOptions options;
  options.first_layer = first_layer;
  options.end_layer = end_layer;
  options.tensor_split = split;
  const ir::KvCacheShape kv_cache{
      model::llama_stage_kv_cache_geometry(model, end_layer - first_layer, 16, DType::kF32, split),
      2, 1};
  FOLIO_ASSIGN_OR_RETURN(
      const ir::Graph graph,
      model::build_llama_step_graph(model, ir::StepShape{1, 1, 1, ir::StepPhase::kDecode}, kv_cache,
                                    options));
  int64_t bytes = 0;
  for (const ir::TensorInfo& tensor : graph.tensors()) {
    if (tensor.residency == ir::Residency::kWeight) bytes += tensor.bytes();
  }
  return bytes;
}

PipelineStageSpec pipeline_stage_spec(const engine::RemoteStepSetup& setup, int64_t first_layer,
                                      int64_t end_layer, int64_t pool_bytes) {
  return PipelineStageSpec{.first_layer = first_layer,
                           .end_layer = end_layer,
                           .num_kv_blocks = setup.num_kv_blocks,
                           .block_size = setup.block_size,
                           .max_blocks_per_sequence = setup.max_blocks_per_sequence,
                           .kv_dtype = setup.kv_dtype,
                           .first_dummy_block = setup.first_dummy_block,
                           .num_dummy_blocks = setup.num_dummy_blocks,
                           .bucket_ladder = setup.bucket_ladder,
                           .max_num_tokens = setup.max_num_tokens,
                           .max_sequences = setup.max_sequences,
                           .max_logit_rows = setup.max_logit_rows,
                           .use_graphs = setup.use_graphs,
                           .pool_bytes = pool_bytes,
                           .tensor_rank = 0,
                           .tensor_ranks = 1,
                           .collective_store = {},
                           .collective_store_address = {},
                           .collective_group_id = "folio-tp",
                           .collective_timeout = std::chrono::milliseconds(30000),
                           .kv_member = 0,
                           .kv_members = 1,
                           .kv_tokens_per_member = 0};
}

Result<std::unique_ptr<PipelineStage>> PipelineStage::create(const model::LlamaModel& model,
                                                             const PipelineStageSpec& spec,
                                                             int num_threads) {
  return create(model, spec, num_threads, nullptr);
}

Result<std::unique_ptr<PipelineStage>> PipelineStage::create(const model::LlamaModel& model,
                                                             const PipelineStageSpec& spec,
                                                             int num_threads,
                                                             std::unique_ptr<Collectives> group) {
  FOLIO_RETURN_IF_ERROR(check_spec(model.shape(), spec));
  if (num_threads < 1) return invalid_argument("a stage needs a thread, got {}", num_threads);
  std::unique_ptr<PipelineStage> stage(new PipelineStage());
  stage->spec_ = spec;
  const model::LlamaTensorSplit split{spec.tensor_rank, spec.tensor_ranks};
  FOLIO_RETURN_IF_ERROR(model::validate_llama_tensor_split(model.shape(), split));
  const ir::WeightSource* weights = &model.weights();
  if (split.is_split()) {
    if (spec.first_layer != 0 || spec.end_layer != model.shape().num_layers) {
      return invalid_argument(
          "a tensor-parallel rank runs every layer (tensor and pipeline splits do not combine "
          "yet), not layers [{}, {})",
          spec.first_layer, spec.end_layer);
    }
    FOLIO_ASSIGN_OR_RETURN(
        stage->shard_, model::LlamaTensorShard::create(model.shape(), model.weights(), split, {}));
    weights = stage->shard_.get();
    // The rank reads the split matrices from its own copies: the mapping's pages of them, read
    // while copying (a row split's pages hold the other ranks' columns too), go back to the OS.
    for (const gguf::GgufTensorInfo& info : model.file().tensors()) {
      if (model::llama_split_axis(info.name) != model::LlamaSplitAxis::kReplicated) {
        model.file().drop_resident_pages(info);
      }
    }
  }
  if (spec.in_group()) {
    if (group == nullptr || group->rank() != spec.group_rank() ||
        group->size() != spec.group_size()) {
      return invalid_argument(
          "{} needs its member of a group of {}, got {}", spec.describe(), spec.group_size(),
          group == nullptr ? std::string("none")
                           : fmt::format("rank {} of {}", group->rank(), group->size()));
    }
    stage->group_ = std::move(group);
    stage->group_steps_ = std::make_unique<GroupStepCollectives>(*stage->group_);
    stage->timed_collectives_ = std::make_unique<TimedStepCollectives>(*stage->group_steps_);
  }
  const model::LlamaShape& shape = stage->shard_ ? stage->shard_->shape() : model.shape();
  FOLIO_ASSIGN_OR_RETURN(stage->weight_bytes_,
                         llama_stage_weight_bytes(shape, spec.first_layer, spec.end_layer, split));
  stage->threads_ = std::make_unique<ThreadPool>(num_threads);
  FOLIO_ASSIGN_OR_RETURN(stage->virtual_memory_, device::make_host_virtual_memory());
  const int64_t page_bytes = spec.pool_bytes >= 16 * kPageBytes ? kPageBytes : kSmallPageBytes;
  memory::PagePoolOptions pool_options;
  pool_options.name =
      split.is_split()      ? fmt::format("tensor_rank_{}_of_{}", split.rank, split.num_ranks)
      : spec.kv_members > 1 ? fmt::format("kv_member_{}_of_{}", spec.kv_member, spec.kv_members)
                            : fmt::format("stage_{}_{}", spec.first_layer, spec.end_layer);
  pool_options.page_size = static_cast<size_t>(page_bytes);
  pool_options.num_pages = std::max<int64_t>(1, spec.pool_bytes / page_bytes);
  FOLIO_ASSIGN_OR_RETURN(stage->pool_,
                         memory::PagePool::create(*stage->virtual_memory_, pool_options));

  // The KV cache of the stage's layers: one contiguous run of the pool, block b at
  // b * block_bytes (one "page" of the layout holding every block).
  const ir::KvCacheGeometry geometry = model::llama_stage_kv_cache_geometry(
      shape, spec.end_layer - spec.first_layer, spec.block_size, spec.kv_dtype, split);
  kernels::PagedKvLayout layout;
  layout.block_size = spec.block_size;
  layout.num_layers = geometry.num_layers;
  layout.num_kv_heads = geometry.num_kv_heads;
  layout.head_dim = geometry.head_dim;
  layout.dtype = spec.kv_dtype;
  layout.block_bytes = geometry.block_bytes();
  layout.blocks_per_page = static_cast<int32_t>(spec.num_kv_blocks);
  layout.page_bytes = layout.block_bytes * spec.num_kv_blocks;
  stage->kv_cache_bytes_ = layout.page_bytes;
  Result<memory::PageAllocation> kv_memory =
      exec::allocate_step_memory(*stage->pool_, static_cast<size_t>(layout.page_bytes),
                                 memory::ContentType::kKvCache, "the stage's KV cache");
  if (!kv_memory.ok()) {
    return kv_memory.status().with_context(fmt::format(
        "layers [{}, {}): {} KV blocks of {} bytes in a pool of {} bytes", spec.first_layer,
        spec.end_layer, spec.num_kv_blocks, layout.block_bytes, spec.pool_bytes));
  }
  stage->kv_memory_ = std::move(kv_memory).value();
  layout.base = stage->kv_memory_.data();
  stage->kv_layout_ = layout;
  stage->arena_ =
      exec::MultiShapeArena::create(std::make_unique<exec::PoolArenaMemory>(*stage->pool_, 1));

  model::LlamaGraphOptions graph_options;
  graph_options.first_layer = spec.first_layer;
  graph_options.end_layer = spec.end_layer;
  graph_options.tensor_split = split;
  if (spec.kv_members > 1) {
    graph_options.kv_range_begin = spec.kv_member * spec.kv_tokens_per_member;
    graph_options.kv_range_end = graph_options.kv_range_begin + spec.kv_tokens_per_member;
  }
  const ir::KvCacheShape kv_cache{geometry, spec.num_kv_blocks, spec.max_blocks_per_sequence};
  exec::ExecutorOptions options;
  options.name = pool_options.name;
  options.bucket_ladder = spec.bucket_ladder;
  options.max_num_tokens = spec.max_num_tokens;
  options.max_sequences = spec.max_sequences;
  options.max_logit_rows = spec.max_logit_rows;
  options.first_dummy_block = spec.first_dummy_block;
  options.num_dummy_blocks = spec.num_dummy_blocks;
  options.mode = spec.use_graphs ? exec::ExecutionMode::kGraph : exec::ExecutionMode::kEager;
  options.collectives = stage->timed_collectives_.get();
  const exec::ExecutorResources resources{
      *stage->threads_, *stage->arena_, *stage->pool_, *weights,
      exec::KvCacheBinding{layout, spec.num_kv_blocks, static_cast<int32_t>(spec.first_layer)}};
  ir::GraphFactory factory = [shape, kv_cache,
                              graph_options](const ir::StepShape& step) -> Result<ir::Graph> {
    return model::build_llama_step_graph(shape, step, kv_cache, graph_options);
  };
  FOLIO_ASSIGN_OR_RETURN(stage->executor_,
                         exec::Executor::create(std::move(factory), resources, std::move(options)));
  return stage;
}

CommunicationStats PipelineStage::communication() const {
  return timed_collectives_ ? timed_collectives_->stats() : CommunicationStats{};
}

PipelineStage::~PipelineStage() {
  executor_.reset();  // before the arena and the pool it uses
  arena_.reset();
  kv_memory_ = memory::PageAllocation();
}

int32_t PipelineStage::vocab_size() const {
  return static_cast<int32_t>(executor_->vocab_size());
}

Status check_block_copies(std::span<const kv::BlockCopy> copies, int64_t num_kv_blocks) {
  std::set<int32_t> sources, destinations;
  for (const kv::BlockCopy& copy : copies) {
    for (const int32_t block : {copy.source, copy.destination}) {
      if (block < 0 || block >= num_kv_blocks) {
        return invalid_argument("KV block {} is outside the stage's {} blocks", block,
                                num_kv_blocks);
      }
    }
    sources.insert(copy.source);
    if (!destinations.insert(copy.destination).second) {
      return invalid_argument("KV block {} is the destination of two copies of one batch",
                              copy.destination);
    }
  }
  for (const int32_t block : destinations) {
    if (sources.contains(block)) {
      return invalid_argument("KV block {} is both a source and a destination of one batch", block);
    }
  }
  return Status();
}

Status PipelineStage::copy_blocks(std::span<const kv::BlockCopy> copies) {
  FOLIO_RETURN_IF_ERROR(check_block_copies(copies, spec_.num_kv_blocks));
  const auto bytes = static_cast<size_t>(kv_layout_.block_bytes);
  for (const kv::BlockCopy& copy : copies) {
    std::memcpy(kv_layout_.block_pointer(copy.destination), kv_layout_.block_pointer(copy.source),
                bytes);
  }
  return Status();
}

Result<ir::StepOutput> PipelineStage::run(const ir::StepBatch& step,
                                          std::span<const float> hidden_in) {
  return executor_->execute(step, hidden_in);
}

}  // namespace folio::dist

// End-to-end: the engine's logits for generated models against an independent reference (the
// PyTorch script tests/data/reference/llama_reference.py, float64, its own GGUF parser). The
// golden files were written by tests/data/reference/regenerate.sh from the same models this
// test generates in memory (same shape, same seed, same bytes: checked by hash).
//
// Each prompt runs (a) as one prefill step asking for the logits of every position and (b) one
// token per step (decode), eagerly and through captured/replayed programs. The LoRA goldens run
// the same way with a graph that has adapter updates and the adapter in slot 1 of the adapter
// table, in both of the table's formats (f16: the hot tier, int8: the warm tier).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "folio/base/random.h"
#include "folio/device/host_virtual_memory.h"
#include "folio/exec/arena_memory.h"
#include "folio/exec/executor.h"
#include "folio/exec/host_buffer.h"
#include "folio/exec/multi_shape_arena.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/kernels/cpu/q8_0_panels.h"
#include "folio/lora/adapter_file.h"
#include "folio/lora/adapter_writer.h"
#include "folio/memory/page_pool.h"
#include "folio/model/llama_model.h"

namespace folio::model {
namespace {

struct ReferenceModel {
  const char* name;
  LlamaArchitecture architecture;
  DType dtype;
  bool tie_embeddings;
  uint64_t seed;
  // Largest |engine - reference| allowed, relative to max(1, largest |reference| logit).
  double tolerance;
  // Changes to the default shape beyond the fields above (make-model's other options).
  void (*customize)(LlamaShape& shape) = nullptr;
};

// A file as model hubs ship them: matrices of several dtypes (make-model --tensor-dtype).
void mix_dtypes(LlamaShape& shape) {
  shape.tensor_dtypes = {
      {"token_embd.weight", DType::kQ8_0},     {"output.weight", DType::kQ8_0},
      {"blk.0.attn_v.weight", DType::kF16},    {"blk.1.attn_v.weight", DType::kF16},
      {"blk.0.ffn_down.weight", DType::kQ4_0}, {"blk.1.attn_q.weight", DType::kBF16}};
}

// Keep in sync with tests/data/reference/regenerate.sh. Tolerances: f32 and f16 weights are
// exact in f32, so only f32 rounding remains; q8_0 and q4_0 matmuls quantize activations to 8
// bits (as ggml does), about 1/254 of each row's largest value per product.
// Heads wider than hidden / heads (attention.key_length, as Gemma and Qwen 3 have): q is
// [T, 4 * 32] over a hidden size of 64.
void widen_heads(LlamaShape& shape) {
  shape.key_length = 32;
}

// RoPE scaling from metadata (rope.scaling.*) and from a rope_freqs.weight tensor. The original
// context of 64 puts the llama3 and yarn ramps inside the 8 pairs of a 16-wide head.
void scale_rope_linearly(LlamaShape& shape) {
  shape.rope_scaling.kind = ir::RopeScalingKind::kLinear;
  shape.rope_scaling.factor = 4.0f;
}
void scale_rope_as_llama3(LlamaShape& shape) {
  shape.rope_scaling.kind = ir::RopeScalingKind::kLlama3;
  shape.rope_scaling.factor = 8.0f;
  shape.rope_scaling.original_context_length = 64;
}
void scale_rope_with_yarn(LlamaShape& shape) {
  shape.rope_scaling.kind = ir::RopeScalingKind::kYarn;
  shape.rope_scaling.factor = 4.0f;
  shape.rope_scaling.original_context_length = 64;
}
void divide_rope_frequencies(LlamaShape& shape) {
  shape.rope_frequency_factors = true;
  scale_rope_linearly(shape);
  shape.rope_scaling.factor = 2.0f;
}

// Mistral's sliding-window attention, with a window shorter than the longest prompt.
void slide_attention_window(LlamaShape& shape) {
  shape.sliding_window = 6;
}

// Gemma 2: layer 0 local (window 6), layer 1 global; caps low enough to bend most attention
// scores (about unit variance after scaling) and logits, wide heads as Gemma has.
void shape_gemma2(LlamaShape& shape) {
  shape.key_length = 32;
  shape.sliding_window = 6;
  shape.attention_logit_soft_cap = 2.0f;
  shape.final_logit_soft_cap = 4.0f;
}

// Gemma 3: layers 0-4 local (window 6, RoPE base 10000 unscaled), layer 5 global (base 10^6,
// make-model's gemma3 default, with linear scaling 8).
void shape_gemma3(LlamaShape& shape) {
  shape.key_length = 32;
  shape.num_layers = 6;
  shape.sliding_window = 6;
  shape.rope_theta = 1e6f;
  shape.rope_scaling.kind = ir::RopeScalingKind::kLinear;
  shape.rope_scaling.factor = 8.0f;
}

constexpr ReferenceModel kReferenceModels[] = {
    {"llama_f32_gqa", LlamaArchitecture::kLlama, DType::kF32, false, 11, 1e-4},
    {"llama_q8_0_gqa", LlamaArchitecture::kLlama, DType::kQ8_0, false, 12, 5e-2},
    {"qwen2_f16_tied", LlamaArchitecture::kQwen2, DType::kF16, true, 13, 1e-4},
    {"llama_mixed_dtypes", LlamaArchitecture::kLlama, DType::kF32, false, 14, 5e-2, mix_dtypes},
    {"llama_head_dim_32", LlamaArchitecture::kLlama, DType::kF16, false, 15, 1e-4, widen_heads},
    {"llama_rope_linear", LlamaArchitecture::kLlama, DType::kF32, false, 16, 1e-4,
     scale_rope_linearly},
    {"llama_rope_llama3", LlamaArchitecture::kLlama, DType::kF32, false, 17, 1e-4,
     scale_rope_as_llama3},
    {"qwen2_rope_yarn", LlamaArchitecture::kQwen2, DType::kF32, false, 18, 1e-4,
     scale_rope_with_yarn},
    {"llama_rope_freqs", LlamaArchitecture::kLlama, DType::kF32, false, 19, 1e-4,
     divide_rope_frequencies},
    {"qwen3_f16_head_dim_32", LlamaArchitecture::kQwen3, DType::kF16, false, 20, 1e-4, widen_heads},
    {"llama_sliding_window_6", LlamaArchitecture::kLlama, DType::kF32, false, 21, 1e-4,
     slide_attention_window},
    {"phi3_f16", LlamaArchitecture::kPhi3, DType::kF16, false, 22, 1e-4},
    {"gemma2_f16", LlamaArchitecture::kGemma2, DType::kF16, true, 23, 1e-4, shape_gemma2},
    {"gemma3_f16", LlamaArchitecture::kGemma3, DType::kF16, true, 24, 1e-4, shape_gemma3},
};

// Keep in sync with the adapters table of tests/data/reference/regenerate.sh.
struct ReferenceAdapter {
  const char* name;
  const ReferenceModel* base;
  int64_t rank;
  DType dtype;
  std::vector<LlamaProjection> projections;
  bool output;
  std::optional<float> alpha;
  uint64_t seed;
  float user_scale;
};

const std::vector<LlamaProjection> kAllProjections = {
    LlamaProjection::kQuery, LlamaProjection::kKey,
    LlamaProjection::kValue, LlamaProjection::kAttentionOutput,
    LlamaProjection::kGate,  LlamaProjection::kUp,
    LlamaProjection::kDown};

const std::vector<ReferenceAdapter>& reference_adapters() {
  static const std::vector<ReferenceAdapter> adapters = {
      {"lora_llama_f32_gqa_f16", &kReferenceModels[0], 16, DType::kF16, kAllProjections, true,
       std::nullopt, 21, 1.0f},
      {"lora_llama_f32_gqa_q8_0", &kReferenceModels[0], 32, DType::kQ8_0, kAllProjections, false,
       16.0f, 22, 1.0f},
      {"lora_qwen2_f16_tied_f16", &kReferenceModels[2], 8, DType::kF16, kAllProjections, false,
       std::nullopt, 23, 0.5f},
      {"lora_qwen2_f16_tied_q8_0", &kReferenceModels[2], 32, DType::kQ8_0, kAllProjections, false,
       std::nullopt, 24, 1.0f},
      {"lora_llama_q8_0_gqa_f16",
       &kReferenceModels[1],
       8,
       DType::kF16,
       {LlamaProjection::kQuery, LlamaProjection::kValue, LlamaProjection::kDown},
       false,
       0.0f,
       25,
       1.0f},
      {"lora_llama_q8_0_gqa_q8_0", &kReferenceModels[1], 32, DType::kQ8_0, kAllProjections, true,
       std::nullopt, 26, 0.5f},
  };
  return adapters;
}

struct Golden {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<std::vector<double>>> logits;  // [prompt][position][vocab]
  std::string model_hash;
};

Golden read_golden(const std::string& name) {
  std::ifstream in(std::string(FOLIO_SOURCE_DIR) + "/tests/data/reference/" + name + ".json");
  EXPECT_TRUE(in.good()) << "missing golden file for " << name;
  nlohmann::json json = nlohmann::json::parse(in);
  Golden golden;
  golden.model_hash = json["model_fnv1a64"].get<std::string>();
  for (const auto& result : json["results"]) {
    golden.prompts.push_back(result["tokens"].get<std::vector<int32_t>>());
    golden.logits.push_back(result["logits"].get<std::vector<std::vector<double>>>());
  }
  return golden;
}

// A model, a flat KV cache and an executor over them.
class ForwardHarness {
 public:
  static constexpr int64_t kBlockSize = 16;
  static constexpr int64_t kMaxBlocksPerSequence = 4;
  static constexpr int64_t kNumBlocks = kMaxBlocksPerSequence + 2;  // + dummy blocks

  // With `adapter`, the graphs have adapter updates and every step runs the adapter from slot 1
  // of an adapter table holding its weights in `format`.
  Status init(const ReferenceModel& reference, exec::ExecutionMode mode,
              const ReferenceAdapter* adapter = nullptr,
              kernels::LoraWeightFormat format = kernels::LoraWeightFormat::kF16) {
    LlamaShape shape;
    shape.architecture = reference.architecture;
    shape.weight_dtype = reference.dtype;
    shape.tie_embeddings = reference.tie_embeddings;
    if (reference.customize != nullptr) reference.customize(shape);
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufWriter writer,
                           make_random_llama_writer(shape, reference.seed));
    FOLIO_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, writer.write_to_buffer());
    model_hash_ = fmt::format("{:016x}", fnv1a64(bytes));
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::parse_owned(std::move(bytes)));
    FOLIO_ASSIGN_OR_RETURN(model_, LlamaModel::from_file(std::move(file), load_options_));

    kernels::PagedKvLayout layout;
    layout.block_size = kBlockSize;
    layout.num_layers = static_cast<int32_t>(shape.num_layers);
    layout.num_kv_heads = static_cast<int32_t>(shape.num_kv_heads);
    layout.head_dim = static_cast<int32_t>(shape.head_dim());
    layout.dtype = DType::kF32;
    layout.block_bytes = kernels::PagedKvLayout::compute_block_bytes(
        layout.num_layers, layout.block_size, layout.num_kv_heads, layout.head_dim, layout.dtype);
    layout.blocks_per_page = kNumBlocks;
    layout.page_bytes = layout.block_bytes * kNumBlocks;
    kv_memory_ = exec::HostBuffer(static_cast<size_t>(layout.page_bytes));
    layout.base = kv_memory_.data();

    FOLIO_ASSIGN_OR_RETURN(vm_, device::make_host_virtual_memory());
    arena_ = exec::MultiShapeArena::create(std::make_unique<exec::DedicatedArenaMemory>(*vm_));
    memory::PagePoolOptions pool_options;
    pool_options.name = "forward_test";
    pool_options.page_size = size_t{64} << 10;
    pool_options.num_pages = 1024;  // 64 MiB: the executor's buffers and eager steps
    FOLIO_ASSIGN_OR_RETURN(page_pool_, memory::PagePool::create(*vm_, pool_options));
    const ir::KvCacheShape kv_cache{model_->kv_cache_geometry(kBlockSize, DType::kF32), kNumBlocks,
                                    kMaxBlocksPerSequence};
    exec::ExecutorOptions options;
    options.max_sequences = 4;
    options.max_logit_rows = 32;
    options.mode = mode;
    options.first_dummy_block = kMaxBlocksPerSequence;
    options.num_dummy_blocks = 2;
    options.bucket_ladder = {1, 2, 4, 8, 16, 32};
    exec::ExecutorResources resources{pool_, *arena_, *page_pool_, model_->weights(),
                                      exec::KvCacheBinding{layout, kNumBlocks, 0}};
    LlamaGraphOptions graph_options;
    if (adapter != nullptr) {
      FOLIO_RETURN_IF_ERROR(bind_adapter(shape, *adapter, format, resources));
      graph_options.adapters = true;
    }
    FOLIO_ASSIGN_OR_RETURN(
        executor_,
        exec::Executor::create(model_->graph_factory(kv_cache, graph_options), resources, options));
    return Status();
  }

  const std::string& adapter_hash() const { return adapter_hash_; }

  // For init: how the model is loaded.
  void set_load_options(const LlamaLoadOptions& options) { load_options_ = options; }
  const LlamaModel& model() const { return *model_; }

  const std::string& model_hash() const { return model_hash_; }

  // Runs tokens [first, first + count) of `prompt` (earlier ones are in the cache) and returns
  // the logits of each of them, f32 [count][vocab].
  Result<std::vector<std::vector<float>>> run(const std::vector<int32_t>& prompt, int32_t first,
                                              int32_t count) {
    std::vector<int32_t> tokens(prompt.begin() + first, prompt.begin() + first + count);
    std::vector<int32_t> positions, slots, logit_rows;
    for (int32_t i = 0; i < count; ++i) {
      positions.push_back(first + i);
      slots.push_back(first + i);  // block table is the identity: block b holds positions b*16..
      logit_rows.push_back(i);
    }
    std::vector<int32_t> query_start = {0, count};
    std::vector<int32_t> seq_lens = {first + count};
    std::vector<int32_t> block_tables(kMaxBlocksPerSequence);
    for (int32_t b = 0; b < kMaxBlocksPerSequence; ++b) block_tables[b] = b;
    const int32_t adapter_slot = 1;
    const ir::StepBatch step{
        tokens,
        positions,
        slots,
        query_start,
        seq_lens,
        block_tables,
        logit_rows,
        {},
        kMaxBlocksPerSequence,
        adapter_table_.empty() ? std::span<const int32_t>() : std::span(&adapter_slot, 1)};
    FOLIO_ASSIGN_OR_RETURN(ir::StepOutput output, executor_->execute(step));
    std::vector<std::vector<float>> rows;
    for (int32_t r = 0; r < output.num_rows; ++r) {
      auto row =
          output.logits.subspan(static_cast<size_t>(r * output.vocab_size), output.vocab_size);
      rows.emplace_back(row.begin(), row.end());
    }
    return rows;
  }

 private:
  static constexpr int32_t kAdapterSlots = 2;  // 0: none, 1: the adapter

  Status bind_adapter(const LlamaShape& shape, const ReferenceAdapter& adapter,
                      kernels::LoraWeightFormat format, exec::ExecutorResources& resources) {
    lora::RandomAdapterOptions options;
    options.rank = adapter.rank;
    options.projections = adapter.projections;
    options.output = adapter.output;
    options.dtype = adapter.dtype;
    options.alpha = adapter.alpha;
    options.seed = adapter.seed;
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufWriter writer,
                           lora::make_random_adapter_writer(shape, options));
    FOLIO_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, writer.write_to_buffer());
    adapter_hash_ = fmt::format("{:016x}", fnv1a64(bytes));
    FOLIO_ASSIGN_OR_RETURN(adapter_file_,
                           lora::AdapterFile::parse(std::move(bytes), adapter.name, shape));
    adapter_weights_ =
        exec::HostBuffer(static_cast<size_t>(lora::adapter_weights_bytes(*adapter_file_, format)));
    FOLIO_ASSIGN_OR_RETURN(
        std::vector<kernels::LoraSlotWeights> weights,
        lora::write_adapter_weights(*adapter_file_, format, adapter.user_scale,
                                    std::span(adapter_weights_.data(), adapter_weights_.size())));
    const auto num_targets = static_cast<int32_t>(weights.size());
    adapter_table_.assign(static_cast<size_t>(num_targets) * kAdapterSlots, {});
    for (int32_t target = 0; target < num_targets; ++target) {
      adapter_table_[static_cast<size_t>(target) * kAdapterSlots + 1] =
          weights[static_cast<size_t>(target)];
    }
    resources.adapters = exec::AdapterTableBinding{
        adapter_table_.data(), num_targets, kAdapterSlots, static_cast<int32_t>(shape.hidden_size)};
    return Status();
  }

  ThreadPool pool_{2};
  LlamaLoadOptions load_options_;
  std::unique_ptr<lora::AdapterFile> adapter_file_;
  exec::HostBuffer adapter_weights_;
  std::vector<kernels::LoraSlotWeights> adapter_table_;
  std::string adapter_hash_;
  std::unique_ptr<LlamaModel> model_;
  exec::HostBuffer kv_memory_;
  std::unique_ptr<device::VirtualMemory> vm_;
  std::unique_ptr<exec::MultiShapeArena> arena_;
  std::unique_ptr<memory::PagePool> page_pool_;
  std::unique_ptr<exec::Executor> executor_;
  std::string model_hash_;
};

// max |actual - expected| / max(1, max |expected|) over a row.
double relative_error(const std::vector<float>& actual, const std::vector<double>& expected) {
  double worst = 0, scale = 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    worst = std::max(worst, std::abs(actual[i] - expected[i]));
    scale = std::max(scale, std::abs(expected[i]));
  }
  return worst / scale;
}

// Runs every golden prompt (a) whole in one step and (b) one token per step over the cache the
// previous steps wrote, and records the worst relative error of each.
void measure_against(ForwardHarness& harness, const Golden& golden, double& worst_prefill,
                     double& worst_decode) {
  for (size_t p = 0; p < golden.prompts.size(); ++p) {
    const std::vector<int32_t>& prompt = golden.prompts[p];
    const auto length = static_cast<int32_t>(prompt.size());
    Result<std::vector<std::vector<float>>> prefill = harness.run(prompt, 0, length);
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    for (int32_t i = 0; i < length; ++i) {
      worst_prefill = std::max(worst_prefill, relative_error((*prefill)[i], golden.logits[p][i]));
    }
    for (int32_t i = 0; i < length; ++i) {
      Result<std::vector<std::vector<float>>> decode = harness.run(prompt, i, 1);
      ASSERT_TRUE(decode.ok()) << decode.status();
      worst_decode = std::max(worst_decode, relative_error((*decode)[0], golden.logits[p][i]));
    }
  }
}

class LlamaForwardTest
    : public ::testing::TestWithParam<std::tuple<ReferenceModel, exec::ExecutionMode>> {};

TEST_P(LlamaForwardTest, LogitsMatchIndependentReference) {
  const auto& [reference, mode] = GetParam();
  Golden golden = read_golden(reference.name);
  ForwardHarness harness;
  ASSERT_TRUE(harness.init(reference, mode).ok());
  ASSERT_EQ(harness.model_hash(), golden.model_hash)
      << "the generated model changed; run tests/data/reference/regenerate.sh";
  double worst_prefill = 0, worst_decode = 0;
  measure_against(harness, golden, worst_prefill, worst_decode);
  EXPECT_LE(worst_prefill, reference.tolerance);
  EXPECT_LE(worst_decode, reference.tolerance);
  std::printf("%s: worst relative error prefill %.3g, decode %.3g (tolerance %.1g)\n",
              reference.name, worst_prefill, worst_decode, reference.tolerance);
}

INSTANTIATE_TEST_SUITE_P(
    GeneratedModels, LlamaForwardTest,
    ::testing::Combine(::testing::ValuesIn(kReferenceModels),
                       ::testing::Values(exec::ExecutionMode::kEager, exec::ExecutionMode::kGraph)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) +
             (std::get<1>(info.param) == exec::ExecutionMode::kEager ? "_eager" : "_graph");
    });

// q8_0 matrices packed at load (kernels/cpu/q8_0_panels.h) give the unpacked model's logits bit
// for bit, in prefill and decode steps, with an LM head of its own and with one tied to the
// embedding table (packed once, the embedding reading its rows from the panels).
TEST(LlamaPackedWeightsTest, PackedQ8_0PanelsGiveTheUnpackedLogitsBitForBit) {
  if (!kernels::cpu::q8_0_panels_supported()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ReferenceModel reference = kReferenceModels[1];
    ASSERT_EQ(reference.dtype, DType::kQ8_0);
    reference.tie_embeddings = tied;
    ForwardHarness packed;
    ForwardHarness unpacked;
    unpacked.set_load_options(LlamaLoadOptions{.pack_q8_0_panels = false});
    ASSERT_TRUE(packed.init(reference, exec::ExecutionMode::kGraph).ok());
    ASSERT_TRUE(unpacked.init(reference, exec::ExecutionMode::kGraph).ok());
    const std::vector<std::string> names = packed.model().packed_tensors();
    EXPECT_TRUE(unpacked.model().packed_tensors().empty());
    const auto has = [&](std::string_view name) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    EXPECT_TRUE(has("blk.0.attn_q.weight"));
    EXPECT_TRUE(has("blk.1.ffn_down.weight"));
    EXPECT_EQ(has("token_embd.weight"), tied);  // only an embedding table that is a matmul's too
    EXPECT_EQ(has("output.weight"), !tied);
    std::vector<int32_t> prompt;
    for (int32_t i = 0; i < 20; ++i) prompt.push_back((i * 37 + 5) % 500);
    const auto expect_same = [](const Result<std::vector<std::vector<float>>>& a,
                                const Result<std::vector<std::vector<float>>>& b) {
      ASSERT_TRUE(a.ok() && b.ok());
      ASSERT_EQ(a->size(), b->size());
      for (size_t row = 0; row < a->size(); ++row) {
        ASSERT_EQ((*a)[row].size(), (*b)[row].size());
        EXPECT_EQ(std::memcmp((*a)[row].data(), (*b)[row].data(), (*a)[row].size() * sizeof(float)),
                  0)
            << "row " << row;
      }
    };
    expect_same(packed.run(prompt, 0, 20), unpacked.run(prompt, 0, 20));
    for (int32_t i = 0; i < 20; ++i)
      expect_same(packed.run(prompt, i, 1), unpacked.run(prompt, i, 1));
  }
}

// Tolerances: an f16 table holds f16 adapter values exactly (q8_0 ones to f16 rounding, 2^-11
// relative), so f32 and f16 bases keep their 1e-4 plus that; the int8 table rounds every value
// to 1/254 of its block's largest (measured: at most 1.2e-2 of the logits' scale on f32 and f16
// bases), and q8_0 bases keep their 5e-2.
double adapter_tolerance(const ReferenceAdapter& adapter, kernels::LoraWeightFormat format) {
  if (format == kernels::LoraWeightFormat::kInt8) {
    return adapter.base->dtype == DType::kQ8_0 ? 5e-2 : 2e-2;
  }
  if (adapter.base->dtype == DType::kQ8_0) return adapter.base->tolerance;
  return adapter.dtype == DType::kQ8_0 ? 2e-3 : adapter.base->tolerance;
}

class LlamaAdapterForwardTest
    : public ::testing::TestWithParam<
          std::tuple<ReferenceAdapter, exec::ExecutionMode, kernels::LoraWeightFormat>> {};

TEST_P(LlamaAdapterForwardTest, LogitsMatchIndependentReference) {
  const auto& [adapter, mode, format] = GetParam();
  Golden golden = read_golden(adapter.name);
  ForwardHarness harness;
  const Status initialized = harness.init(*adapter.base, mode, &adapter, format);
  ASSERT_TRUE(initialized.ok()) << initialized;
  ASSERT_EQ(harness.model_hash(), golden.model_hash)
      << "the generated model changed; run tests/data/reference/regenerate.sh";
  std::ifstream in(std::string(FOLIO_SOURCE_DIR) + "/tests/data/reference/" + adapter.name +
                   ".json");
  const nlohmann::json json = nlohmann::json::parse(in);
  ASSERT_EQ(harness.adapter_hash(), json["adapter_fnv1a64"].get<std::string>())
      << "the generated adapter changed; run tests/data/reference/regenerate.sh";
  const double tolerance = adapter_tolerance(adapter, format);
  double worst_prefill = 0, worst_decode = 0;
  measure_against(harness, golden, worst_prefill, worst_decode);
  EXPECT_LE(worst_prefill, tolerance);
  EXPECT_LE(worst_decode, tolerance);
  std::printf("%s (%s table): worst relative error prefill %.3g, decode %.3g (tolerance %.1g)\n",
              adapter.name, std::string(kernels::lora_weight_format_name(format)).c_str(),
              worst_prefill, worst_decode, tolerance);
}

INSTANTIATE_TEST_SUITE_P(
    GeneratedAdapters, LlamaAdapterForwardTest,
    ::testing::Combine(::testing::ValuesIn(reference_adapters()),
                       ::testing::Values(exec::ExecutionMode::kEager, exec::ExecutionMode::kGraph),
                       ::testing::Values(kernels::LoraWeightFormat::kF16,
                                         kernels::LoraWeightFormat::kInt8)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) +
             (std::get<1>(info.param) == exec::ExecutionMode::kEager ? "_eager" : "_graph") + "_" +
             std::string(kernels::lora_weight_format_name(std::get<2>(info.param)));
    });

}  // namespace
}  // namespace folio::model

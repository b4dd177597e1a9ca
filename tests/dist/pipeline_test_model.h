// Fixtures of the pipeline tests: a generated model written to a file (with its identity as a
// worker reports it), the stage spec of the step script (testing/pipeline_steps.h) and
// WorkerServices on loopback holding that file.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/check.h"
#include "folio/base/random.h"
#include "folio/dist/pipeline_stage.h"
#include "folio/dist/worker_client.h"
#include "folio/dist/worker_service.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/model/llama_model.h"
#include "testing/collective_groups.h"
#include "testing/pipeline_steps.h"
#include "testing/random_model_file.h"

namespace folio::dist::testing {

inline constexpr int64_t kNumLayers = 4;
inline constexpr int32_t kVocab = 512;  // make_random_llama_writer's default shape

// kNumLayers layers of `dtype`, in "model.gguf".
inline model::LlamaShape pipeline_test_shape(DType dtype) {
  model::LlamaShape shape;
  shape.num_layers = kNumLayers;
  shape.weight_dtype = dtype;
  return shape;
}

struct ModelOnDisk : folio::testing::RandomModelFile {
  explicit ModelOnDisk(DType dtype, uint64_t seed = 41)
      : RandomModelFile(pipeline_test_shape(dtype), seed) {}
};

inline PipelineStageSpec stage_spec(int64_t first, int64_t end, bool use_graphs,
                                    DType kv_dtype = DType::kF32) {
  using Script = folio::testing::PipelineStepScript;
  PipelineStageSpec spec;
  spec.first_layer = first;
  spec.end_layer = end;
  spec.num_kv_blocks = Script::kNumBlocks;
  spec.block_size = Script::kBlockSize;
  spec.max_blocks_per_sequence = Script::kMaxBlocksPerSequence;
  spec.kv_dtype = kv_dtype;
  spec.first_dummy_block = Script::kFirstDummyBlock;
  spec.num_dummy_blocks = Script::kNumDummyBlocks;
  spec.bucket_ladder = {1, 2, 4, 8, 16, 32};
  spec.max_sequences = Script::kMaxSequences;
  spec.max_logit_rows = 8;
  spec.use_graphs = use_graphs;
  spec.pool_bytes = int64_t{16} << 20;
  return spec;
}

// A worker of 2 threads holding `model` (with_model false: holding none), declaring `memory`
// bytes (0: no budget).
inline std::unique_ptr<WorkerService> start_worker(const ModelOnDisk& model, uint64_t memory = 0,
                                                   bool with_model = true) {
  WorkerServiceOptions options;
  options.threads = 2;
  options.memory_budget_bytes = memory;
  if (with_model) {
    options.model = model.identity;
    options.model_path = model.path;
  }
  Result<std::unique_ptr<WorkerService>> service = WorkerService::start(options);
  FOLIO_CHECK(service.ok(), "{}", service.status().to_string());
  return std::move(service).value();
}

inline std::unique_ptr<WorkerClient> connect_to(const WorkerService& service) {
  Result<std::unique_ptr<WorkerClient>> client =
      WorkerClient::connect(service.address(), ModelIdentity{});
  FOLIO_CHECK(client.ok(), "{}", client.status().to_string());
  return std::move(client).value();
}

// The logits of every step of the script from the whole model in this process (one stage of
// every layer, 2 threads as the workers): the reference pipelines must equal bit for bit.
inline std::vector<std::vector<float>> reference_logits(const ModelOnDisk& model,
                                                        const PipelineStageSpec& whole_spec) {
  Result<std::unique_ptr<model::LlamaModel>> local = model::LlamaModel::open(model.path);
  FOLIO_CHECK(local.ok(), "{}", local.status().to_string());
  Result<std::unique_ptr<PipelineStage>> whole = PipelineStage::create(**local, whole_spec, 2);
  FOLIO_CHECK(whole.ok(), "{}", whole.status().to_string());
  folio::testing::PipelineStepMaker maker(kVocab);
  std::vector<std::vector<float>> logits;
  for (size_t index = 0; index < folio::testing::PipelineStepScript::steps().size(); ++index) {
    const folio::testing::PipelineStepArrays arrays = maker.make(index);
    Result<ir::StepOutput> output = (*whole)->run(arrays.batch(), {});
    FOLIO_CHECK(output.ok(), "{}", output.status().to_string());
    logits.emplace_back(output->logits.begin(), output->logits.end());
  }
  return logits;
}

// Every step of the script's arrays, made in order.
inline std::vector<folio::testing::PipelineStepArrays> script_steps() {
  folio::testing::PipelineStepMaker maker(kVocab);
  std::vector<folio::testing::PipelineStepArrays> steps;
  for (size_t index = 0; index < folio::testing::PipelineStepScript::steps().size(); ++index) {
    steps.push_back(maker.make(index));
  }
  return steps;
}

// A step's logits equal, bit for bit, to the reference's row of step `step`.
inline void expect_bit_equal(const Result<ir::StepOutput>& actual,
                             const std::vector<float>& expected, size_t step) {
  ASSERT_TRUE(actual.ok()) << "step " << step << ": " << actual.status();
  ASSERT_EQ(actual->logits.size(), expected.size()) << "step " << step;
  EXPECT_EQ(std::memcmp(actual->logits.data(), expected.data(), expected.size() * sizeof(float)), 0)
      << "step " << step;
}

}  // namespace folio::dist::testing

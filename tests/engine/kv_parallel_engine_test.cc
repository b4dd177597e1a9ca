// The engine over a KV-parallel group (dist.md "KV-parallel groups"): a ModelEngine with
// kv_parallel_members > 1 schedules over a kv::KvParallelCache and hands every step, with each
// member's slots and block tables, to an in-process group of member executors
// (testing/kv_parallel_step_runner.h). A request whose context fits no single member must give
// the greedy tokens of a plain ModelEngine with enough memory, its logprobs within 1e-4
// (only the attention's summation order differs); a request beyond the group's context is
// refused with an actionable message; members short of blocks make requests wait or be
// preempted, never corrupt them. Then the engine's batch-invariance suite over the group.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_invariance_suite.h"
#include "engine_test_util.h"
#include "folio/engine/model_engine.h"
#include "folio/model/llama_model_file.h"
#include "testing/kv_parallel_step_runner.h"

namespace folio::engine {
namespace {

using testing::Recorder;
using testing::RequestSpec;

constexpr int64_t kPageBytes = 16 << 10;  // 8 blocks of 8 tokens (f16)

class KvParallelEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_path_ = new std::string((std::filesystem::path(::testing::TempDir()) /
                                   ("folio_kvp_engine_model_" + std::to_string(getpid()) + ".gguf"))
                                      .string());
    model::LlamaShape shape;
    shape.context_length = 128;
    ASSERT_TRUE(model::write_random_llama_model(*model_path_, shape, 23).ok());
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*model_path_);
    delete model_path_;
  }

  static ModelEngineOptions plain_options() {
    ModelEngineOptions options;
    options.num_threads = 1;
    options.memory_budget_bytes = 4 << 20;
    options.page_bytes = kPageBytes;
    options.block_size = 8;
    options.kv_dtype = DType::kF16;
    options.use_graphs = false;
    options.precapture_seconds = 0;
    options.scheduler.max_num_batched_tokens = 64;
    options.scheduler.max_num_sequences = 8;
    options.scheduler.prefill_chunk_size = 24;
    options.scheduler.max_preemptions = 100000;
    return options;
  }

  // members of tokens_per_member each, every member's cache member_pages pages.
  static ModelEngineOptions group_options(int32_t members, int32_t tokens_per_member,
                                          int32_t member_pages, bool use_graphs = false) {
    ModelEngineOptions options = plain_options();
    options.use_graphs = use_graphs;
    options.kv_parallel_members = members;
    options.kv_tokens_per_member = tokens_per_member;
    options.kv_cache_bytes = member_pages * kPageBytes;
    options.remote_runner =
        [](const RemoteStepSetup& setup) -> Result<std::unique_ptr<StepRunner>> {
      FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<folio::testing::KvParallelStepRunner> runner,
                             folio::testing::KvParallelStepRunner::create(*model_path_, setup));
      return std::unique_ptr<StepRunner>(std::move(runner));
    };
    return options;
  }

  static std::unique_ptr<ModelEngine> make(const ModelEngineOptions& options) {
    Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(*model_path_);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return nullptr;
    Result<std::unique_ptr<ModelEngine>> bundle = ModelEngine::create(std::move(*model), options);
    EXPECT_TRUE(bundle.ok()) << bundle.status();
    return bundle.ok() ? std::move(bundle).value() : nullptr;
  }

  static RequestSpec long_request(int32_t prompt_tokens, int32_t max_tokens, uint64_t seed) {
    RequestSpec spec;
    uint64_t state = seed;
    spec.prompt = testing::random_prompt(state, prompt_tokens, 509);
    for (int32_t& token : spec.prompt) token += 3;
    spec.max_tokens = max_tokens;
    spec.ignore_eos = true;
    spec.sampling.temperature = 0.0f;
    spec.logprobs = 3;
    return spec;
  }

  // Runs `specs` to the end (checking invariants every step); returns each request's stream.
  static std::vector<Recorder::Stream> run(ModelEngine& bundle,
                                           const std::vector<RequestSpec>& specs,
                                           EngineStats* stats = nullptr) {
    Recorder recorder;
    std::vector<RequestId> ids;
    for (const RequestSpec& spec : specs) {
      Request request = testing::to_request(spec);
      Result<RequestId> id = bundle.engine().submit(recorder.attach(request));
      EXPECT_TRUE(id.ok()) << id.status();
      if (id.ok()) ids.push_back(*id);
    }
    for (int steps = 0; bundle.engine().has_unfinished_requests(); ++steps) {
      bundle.engine().step();
      bundle.engine().check_invariants();
      if (steps > 5000) {
        ADD_FAILURE() << "no end after 5000 steps";
        break;
      }
    }
    std::vector<Recorder::Stream> streams;
    for (RequestId id : ids) {
      const Completion completion = recorder.completion(id);
      EXPECT_EQ(completion.reason, FinishReason::kLength) << completion.error;
      streams.push_back(recorder.stream(id));
    }
    if (stats != nullptr) *stats = bundle.engine().stats();
    return streams;
  }

  static void expect_same(const Recorder::Stream& expected, const Recorder::Stream& actual) {
    EXPECT_EQ(actual.tokens, expected.tokens);
    ASSERT_EQ(actual.logprobs.size(), expected.logprobs.size());
    for (size_t index = 0; index < expected.logprobs.size(); ++index) {
      const double want = expected.logprobs[index].logprob;
      const double got = actual.logprobs[index].logprob;
      EXPECT_LE(std::abs(got - want), 1e-4 * std::max(1.0, std::abs(want)))
          << "token " << index << ": logprob " << got << ", alone " << want;
    }
  }

  static inline std::string* model_path_ = nullptr;
};

TEST_F(KvParallelEngineTest, LongRequestFittingNoMemberMatchesOneProcess) {
  // 70 prompt tokens + 20 generated: 90 tokens over three members of 32.
  const std::vector<RequestSpec> specs = {long_request(70, 20, 7)};
  std::unique_ptr<ModelEngine> plain = make(plain_options());
  ASSERT_NE(plain, nullptr);
  const std::vector<Recorder::Stream> expected = run(*plain, specs);
  for (bool use_graphs : {false, true}) {
    std::unique_ptr<ModelEngine> group = make(group_options(3, 32, 2, use_graphs));
    ASSERT_NE(group, nullptr);
    ASSERT_NE(group->kv_parallel_cache(), nullptr);
    const std::vector<Recorder::Stream> actual = run(*group, specs);
    ASSERT_EQ(actual.size(), 1u);
    expect_same(expected[0], actual[0]);
    group->kv_parallel_cache()->check_cache_invariants();
    EXPECT_EQ(group->kv_parallel_cache()->num_sequences(), 0);
    for (int32_t member = 0; member < 3; ++member) {
      EXPECT_EQ(group->kv_parallel_cache()->group(member).num_sequences(), 0);
    }
  }
}

TEST_F(KvParallelEngineTest, RequestBeyondTheGroupIsRefusedWithAnActionableMessage) {
  std::unique_ptr<ModelEngine> group = make(group_options(2, 32, 2));
  ASSERT_NE(group, nullptr);
  Recorder recorder;
  Request request = testing::to_request(long_request(70, 4, 3));
  Result<RequestId> id = group->engine().submit(recorder.attach(request));
  // Beyond 2 x 32 tokens: refused at submission (the engine's context is the group's).
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("64"), std::string::npos) << id.status();
}

TEST_F(KvParallelEngineTest, MemberCapacityBelowItsRangeNeverFits) {
  // Each member's cache holds one page (8 blocks: 64 tokens, less its watermark and padding
  // blocks) but its range is 64 tokens: a sequence filling a member's range never fits.
  std::unique_ptr<ModelEngine> group = make(group_options(2, 64, 1));
  ASSERT_NE(group, nullptr);
  Recorder recorder;
  Request request = testing::to_request(long_request(100, 4, 5));
  Result<RequestId> id = group->engine().submit(recorder.attach(request));
  ASSERT_TRUE(id.ok()) << id.status();
  while (group->engine().has_unfinished_requests()) group->engine().step();
  const Completion completion = recorder.completion(*id);
  EXPECT_EQ(completion.reason, FinishReason::kError);
  EXPECT_EQ(completion.error.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(completion.error.message().find("KV-parallel group of 2 members"), std::string::npos)
      << completion.error;
}

TEST_F(KvParallelEngineTest, MembersShortOfBlocksPreemptWithoutCorruption) {
  // Six requests of 20..35 prompt tokens + 40 generated over two members of 40 tokens, each
  // member's cache two pages (16 blocks, some for padding): admitted on member 0's free blocks,
  // their decodes outgrow it and then open member 1.
  std::vector<RequestSpec> specs;
  for (int32_t index = 0; index < 6; ++index) {
    specs.push_back(long_request(20 + 3 * index, 40, 100 + static_cast<uint64_t>(index)));
  }
  std::unique_ptr<ModelEngine> plain = make(plain_options());
  ASSERT_NE(plain, nullptr);
  std::vector<Recorder::Stream> alone;
  for (const RequestSpec& spec : specs) alone.push_back(run(*plain, {spec}).at(0));
  std::unique_ptr<ModelEngine> group = make(group_options(2, 40, 2));
  ASSERT_NE(group, nullptr);
  EngineStats stats;
  const std::vector<Recorder::Stream> together = run(*group, specs, &stats);
  ASSERT_EQ(together.size(), specs.size());
  EXPECT_GT(stats.preemptions_by_recompute, 0) << "the members' caches must force preemption";
  for (size_t index = 0; index < specs.size(); ++index) {
    SCOPED_TRACE(::testing::Message() << "request " << index);
    expect_same(alone[index], together[index]);
  }
}

TEST_F(KvParallelEngineTest, RefusesWhatTheGroupCannotDo) {
  ModelEngineOptions options = group_options(2, 32, 2);
  options.remote_runner = nullptr;
  {
    Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(*model_path_);
    ASSERT_TRUE(model.ok());
    Result<std::unique_ptr<ModelEngine>> bundle = ModelEngine::create(std::move(*model), options);
    ASSERT_FALSE(bundle.ok());
    EXPECT_NE(bundle.status().message().find("remote_runner"), std::string::npos)
        << bundle.status();
  }
  options = group_options(2, 32, 2);
  options.scheduler.preemption_mode = PreemptionMode::kSwap;
  {
    Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(*model_path_);
    ASSERT_TRUE(model.ok());
    Result<std::unique_ptr<ModelEngine>> bundle = ModelEngine::create(std::move(*model), options);
    ASSERT_FALSE(bundle.ok());
    EXPECT_NE(bundle.status().message().find("recompute"), std::string::npos) << bundle.status();
  }
  options = group_options(2, 32, 2);
  options.swap_bytes = 1 << 20;
  {
    Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(*model_path_);
    ASSERT_TRUE(model.ok());
    EXPECT_FALSE(ModelEngine::create(std::move(*model), options).ok());
  }
}

}  // namespace

// The batch-invariance suite with every step on a KV-parallel group of two members (each
// member's cache the suite's KV budget, ample when it sets none): swap does not apply to a
// group, nor the pool pressure case (the pool holds none of its KV), so those are skipped.
namespace invariance {
namespace {

struct KvParallelSteps {
  static constexpr bool kSupportsSwap = false;
  // The pool holds no KV of a group (its members do), so the suite's pool pressure case does not
  // apply.
  static constexpr bool kHasPagePool = false;

  static void set_up(const std::string& model_path) { model_path_ = new std::string(model_path); }
  static void tear_down() { delete model_path_; }

  static void apply(ModelEngineOptions& options) {
    options.kv_parallel_members = 2;
    // Ample: 512 blocks per member, every request of the suite at once (1 MiB each).
    if (options.kv_cache_bytes == 0) options.kv_cache_bytes = int64_t{64} * (16 << 10);
    options.remote_runner =
        [](const RemoteStepSetup& setup) -> Result<std::unique_ptr<StepRunner>> {
      FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<folio::testing::KvParallelStepRunner> runner,
                             folio::testing::KvParallelStepRunner::create(*model_path_, setup));
      return std::unique_ptr<StepRunner>(std::move(runner));
    };
  }

  static inline std::string* model_path_ = nullptr;
};

using KvParallelModelRunner = ModelRunnerOf</*kAdapters=*/false, KvParallelSteps>;

struct KvParallelRunnerNames {
  template <typename Runner>
  static std::string GetName(int) {
    return "KvParallelModel";
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(KvParallel, EngineInvarianceTest,
                               ::testing::Types<KvParallelModelRunner>, KvParallelRunnerNames);

}  // namespace
}  // namespace invariance
}  // namespace folio::engine

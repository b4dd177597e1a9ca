// The engine with LoRA adapters (lora/adapter_manager.h), beyond batch invariance (which
// engine_invariance_test.cc covers): the prefix cache never serves one adapter's KV to other
// weights, even under the same name; a failed adapter load fails its request and nothing else;
// a rare adapter is not starved by popular ones; unloading an adapter in use lets its requests
// finish.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "folio/engine/model_engine.h"
#include "folio/lora/adapter_writer.h"
#include "folio/model/llama_model_file.h"

namespace folio::engine {
namespace {

using testing::Recorder;

class AdapterEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = std::filesystem::path(::testing::TempDir()) /
                 fmt::format("folio_adapter_engine_{}_{}", getpid(),
                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(directory_);
    shape_.context_length = 128;
    shape_.weight_dtype = DType::kF32;
    model_path_ = (directory_ / "model.gguf").string();
    ASSERT_TRUE(model::write_random_llama_model(model_path_, shape_, 5).ok());
  }
  void TearDown() override {
    model_engine_.reset();
    std::filesystem::remove_all(directory_);
  }

  void start(int32_t max_sequences = 8) {
    Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(model_path_);
    ASSERT_TRUE(model.ok()) << model.status();
    ModelEngineOptions options;
    options.num_threads = 1;
    options.memory_budget_bytes = 4 << 20;
    options.page_bytes = 16 << 10;
    options.block_size = 8;
    options.precapture_seconds = 0;
    options.scheduler.max_num_sequences = max_sequences;
    options.scheduler.max_num_batched_tokens = 64;
    options.adapters = true;
    Result<std::unique_ptr<ModelEngine>> bundle = ModelEngine::create(std::move(*model), options);
    ASSERT_TRUE(bundle.ok()) << bundle.status();
    model_engine_ = std::move(*bundle);
  }

  std::string write_adapter(const std::string& file, uint64_t seed) {
    lora::RandomAdapterOptions options;
    options.rank = 8;
    options.seed = seed;
    Result<gguf::GgufWriter> writer = lora::make_random_adapter_writer(shape_, options);
    EXPECT_TRUE(writer.ok()) << writer.status();
    const std::string path = (directory_ / file).string();
    EXPECT_TRUE(writer->write_file(path).ok());
    return path;
  }

  int64_t register_adapter(const std::string& name, const std::string& path) {
    Result<lora::AdapterInfo> info = model_engine_->adapters()->register_adapter(name, path);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->id : -1;
  }

  Request request(int64_t adapter, int32_t max_tokens = 8) {
    Request request;
    request.prompt = {1, 17, 29, 41, 53, 67, 71, 83, 97, 101, 113, 127, 131, 137, 149, 151, 163};
    request.max_tokens = max_tokens;
    request.ignore_eos = true;
    request.sampling.temperature = 0.0f;  // greedy
    request.adapter_id = adapter;
    return request;
  }

  // Runs `requests` to the end; returns their ids in order.
  std::vector<RequestId> run(std::vector<Request> requests) {
    std::vector<RequestId> ids;
    for (Request& r : requests) {
      Result<RequestId> id = model_engine_->engine().submit(recorder_.attach(r));
      EXPECT_TRUE(id.ok()) << id.status();
      if (id.ok()) ids.push_back(*id);
    }
    int32_t steps = 0;
    while (model_engine_->engine().has_unfinished_requests() && ++steps < 100000) {
      model_engine_->engine().step();
    }
    return ids;
  }

  std::vector<int32_t> generate(int64_t adapter) {
    const std::vector<RequestId> ids = run({request(adapter)});
    const Completion completion = recorder_.completion(ids.at(0));
    EXPECT_NE(completion.reason, FinishReason::kError) << completion.error;
    return recorder_.stream(ids.at(0)).tokens;
  }

  model::LlamaShape shape_;
  std::filesystem::path directory_;
  std::string model_path_;
  Recorder recorder_;
  std::unique_ptr<ModelEngine> model_engine_;
};

TEST_F(AdapterEngineTest, ReloadingOtherWeightsUnderTheSameNameNeverReusesTheirKv) {
  start();
  const std::string path = write_adapter("tenant.gguf", 1);
  const std::string other = write_adapter("other.gguf", 2);
  // What the second weights give, computed in their own namespace first.
  const std::vector<int32_t> second = generate(register_adapter("reference", other));
  const int64_t first_id = register_adapter("tenant", path);
  const std::vector<int32_t> first = generate(first_id);
  ASSERT_NE(first, second) << "the two adapters must differ for this test to mean anything";

  // Same name, other weights at the same path: the prompt's blocks cached under the old
  // weights must not serve the new ones.
  ASSERT_TRUE(model_engine_->adapters()->unregister_adapter("tenant").ok());
  std::filesystem::copy_file(other, path, std::filesystem::copy_options::overwrite_existing);
  const int64_t reloaded = register_adapter("tenant", path);
  EXPECT_NE(reloaded, first_id);
  EXPECT_EQ(generate(reloaded), second);
  // And the base model's own cached prefix is still its own.
  const std::vector<int32_t> base = generate(0);
  EXPECT_NE(base, first);
  EXPECT_EQ(generate(0), base);
}

TEST_F(AdapterEngineTest, FailedLoadFailsOnlyItsRequest) {
  start();
  const int64_t good = register_adapter("good", write_adapter("good.gguf", 3));
  const std::string bad_path = write_adapter("bad.gguf", 4);
  const int64_t bad = register_adapter("bad", bad_path);
  std::filesystem::resize_file(bad_path, 64);  // truncated after registration
  const std::vector<RequestId> ids = run({request(good), request(bad), request(0)});
  EXPECT_NE(recorder_.completion(ids[0]).reason, FinishReason::kError);
  const Completion failed = recorder_.completion(ids[1]);
  EXPECT_EQ(failed.reason, FinishReason::kError);
  EXPECT_NE(failed.error.message().find(bad_path), std::string::npos) << failed.error;
  EXPECT_NE(recorder_.completion(ids[2]).reason, FinishReason::kError);
  EXPECT_EQ(recorder_.stream(ids[0]).tokens.size(), 8u);
  EXPECT_EQ(recorder_.stream(ids[2]).tokens.size(), 8u);
}

TEST_F(AdapterEngineTest, UnknownAdapterIsRefusedAtSubmission) {
  start();
  Request unknown = request(42);
  Result<RequestId> id = model_engine_->engine().submit(recorder_.attach(unknown));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kNotFound);
}

// Two sequences at a time; six requests for a popular adapter, then one for a rare adapter, then
// six more popular ones. Admission goes by arrival, not by how many requests an adapter has
// waiting (the seed's batcher's order, which would serve the popular adapter's twelve first):
// the rare request starts before every popular request that arrived after it. Both adapters are
// loaded first, so the order does not depend on how fast the loader thread runs.
TEST_F(AdapterEngineTest, RareAdapterIsNotStarvedByPopularOnes) {
  start(/*max_sequences=*/2);
  const int64_t popular = register_adapter("popular", write_adapter("popular.gguf", 5));
  const int64_t rare = register_adapter("rare", write_adapter("rare.gguf", 6));
  for (const int64_t id : {popular, rare}) {
    lora::AdapterManager& adapters = *model_engine_->adapters();
    Result<lora::AdapterReadiness> readiness = adapters.acquire(id);
    while (readiness.ok() && *readiness == lora::AdapterReadiness::kLoading) {
      adapters.wait_for_loads();
      readiness = adapters.acquire(id);
    }
    ASSERT_TRUE(readiness.ok()) << readiness.status();
    adapters.release(id);
  }
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(request(popular, 4));
  requests.push_back(request(rare, 4));
  for (int i = 0; i < 6; ++i) requests.push_back(request(popular, 4));
  std::vector<RequestId> ids;
  for (Request& r : requests) {
    Result<RequestId> id = model_engine_->engine().submit(recorder_.attach(r));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  // The step in which each request got its first token: steps, not times, so that requests
  // started in the same step are not ordered by the microseconds between their submissions.
  std::vector<int32_t> first_token_step(ids.size(), -1);
  for (int32_t step = 0; step < 100000 && model_engine_->engine().has_unfinished_requests();
       ++step) {
    model_engine_->engine().step();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (first_token_step[i] < 0 && !recorder_.stream(ids[i]).tokens.empty()) {
        first_token_step[i] = step;
      }
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_NE(recorder_.completion(ids[i]).reason, FinishReason::kError);
    ASSERT_GE(first_token_step[i], 0);
  }
  int32_t later_popular_before_rare = 0;
  for (size_t i = 7; i < ids.size(); ++i) {
    if (first_token_step[i] < first_token_step[6]) ++later_popular_before_rare;
  }
  EXPECT_EQ(later_popular_before_rare, 0);
}

TEST_F(AdapterEngineTest, UnloadingAnAdapterInUseLetsItsRequestsFinish) {
  start();
  const int64_t id = register_adapter("busy", write_adapter("busy.gguf", 7));
  Request running = request(id, 24);
  Result<RequestId> running_id = model_engine_->engine().submit(recorder_.attach(running));
  ASSERT_TRUE(running_id.ok());
  // Until it runs (its adapter loaded and it admitted) and has decoded a few tokens.
  for (int i = 0; i < 100000 && recorder_.stream(*running_id).tokens.size() < 4; ++i) {
    model_engine_->engine().step();
  }
  ASSERT_GE(recorder_.stream(*running_id).tokens.size(), 4u);
  ASSERT_TRUE(model_engine_->adapters()->unregister_adapter("busy").ok());
  Request late = request(id);
  EXPECT_EQ(model_engine_->engine().submit(recorder_.attach(late)).status().code(),
            StatusCode::kNotFound);
  while (model_engine_->engine().has_unfinished_requests()) model_engine_->engine().step();
  const Completion completion = recorder_.completion(*running_id);
  EXPECT_NE(completion.reason, FinishReason::kError) << completion.error;
  EXPECT_EQ(recorder_.stream(*running_id).tokens.size(), 24u);
  model_engine_->engine().step();
  EXPECT_EQ(model_engine_->adapters()->stats().hot.adapters, 0) << "freed after its last request";
  model_engine_->adapters()->check_invariants();
}

}  // namespace
}  // namespace folio::engine

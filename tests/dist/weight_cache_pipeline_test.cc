// The weight cache over the control plane (protocol revision 6), WorkerServices on loopback
// without the model file: a PP=2 pipeline whose workers are sent their shards gives logits
// bit-equal to the whole model in one process; the first start fetches exactly each shard's
// tensor bytes (the sum of its tensors' sizes in the file, found here by name), a second start
// over the same caches fetches nothing, a corrupted entry is fetched again (its size, no more);
// a tied LM head travels with the last stage; bytes that do not match the manifest's hash are
// refused; manifests and workers that cannot take a shard are refused with their reasons.
#include <filesystem>
#include <fstream>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/shard_manifest.h"
#include "folio/dist/shard_source.h"
#include "folio/dist/weight_cache.h"
#include "pipeline_test_model.h"

namespace folio::dist {
namespace {

using testing::expect_bit_equal;
using ::testing::HasSubstr;
using testing::kNumLayers;
using testing::ModelOnDisk;
using testing::stage_spec;

// The tensors a stage of layers [first, end) reads, by the file's naming rule (independent of
// llama_shard_tensor_names): its blocks, the embedding for the first stage, the final norm and
// the LM head (the embedding when tied) for the last.
std::set<std::string> shard_tensor_names(const gguf::GgufFile& file, int64_t first, int64_t end) {
  std::set<std::string> names;
  const bool tied = file.find_tensor("output.weight") == nullptr;
  for (const gguf::GgufTensorInfo& info : file.tensors()) {
    const std::string& name = info.name;
    bool wanted = false;
    for (int64_t layer = first; layer < end; ++layer) {
      wanted = wanted || name.starts_with(fmt::format("blk.{}.", layer));
    }
    if (name == "token_embd.weight") wanted = first == 0 || (tied && end == kNumLayers);
    if (name == "output_norm.weight" || name == "output.weight") wanted = end == kNumLayers;
    if (wanted) names.insert(name);
  }
  return names;
}

int64_t shard_bytes(const gguf::GgufFile& file, int64_t first, int64_t end) {
  int64_t bytes = 0;
  for (const std::string& name : shard_tensor_names(file, first, end)) {
    bytes += static_cast<int64_t>(file.find_tensor(name)->byte_size);
  }
  return bytes;
}

std::unique_ptr<WorkerService> start_cache_worker(const std::string& cache_directory,
                                                  uint64_t memory = 0) {
  WorkerServiceOptions options;
  options.threads = 2;
  options.memory_budget_bytes = memory;
  options.cache_directory = cache_directory;
  Result<std::unique_ptr<WorkerService>> service = WorkerService::start(options);
  FOLIO_CHECK(service.ok(), "{}", service.status().to_string());
  return std::move(service).value();
}

// One start of a PP=2 pipeline ([0, 2), [2, 4)) over fresh cache workers on `caches`, with a
// fresh ShardSource: returns the bytes it fetched after checking every step bit-equal.
int64_t run_cached_pipeline(const ModelOnDisk& model, const std::vector<std::string>& caches,
                            bool use_graphs, const std::vector<std::vector<float>>& expected) {
  Result<gguf::GgufFile> file = gguf::GgufFile::open(model.path);
  FOLIO_CHECK(file.ok(), "{}", file.status().to_string());
  ShardSource source(*file, model.identity.hash);
  std::vector<std::unique_ptr<WorkerService>> services;
  std::vector<std::unique_ptr<WorkerClient>> clients;
  for (const std::string& cache : caches) {
    services.push_back(start_cache_worker(cache));
    clients.push_back(testing::connect_to(*services.back()));
  }
  PipelineRecoveryOptions options;
  options.weight_source = &source;
  options.lease_misses = 20;
  Result<std::unique_ptr<PipelineStepRunner>> runner = PipelineStepRunner::create(
      std::move(clients), {stage_spec(0, 2, use_graphs), stage_spec(2, kNumLayers, use_graphs)},
      model.identity.hash, options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return -1;
  const std::vector<folio::testing::PipelineStepArrays> steps = testing::script_steps();
  for (size_t index = 0; index < steps.size(); ++index) {
    expect_bit_equal((*runner)->run(steps[index].batch()), expected[index], index);
  }
  return source.bytes_fetched_total();
}

struct CacheCase {
  DType dtype;
  bool use_graphs;
};

class WeightCachePipelineTest : public ::testing::TestWithParam<CacheCase> {};

TEST_P(WeightCachePipelineTest, ColdStartFetchesTheShardsWarmStartNothingCorruptedEntryAgain) {
  const ModelOnDisk model(GetParam().dtype);
  const std::vector<std::vector<float>> expected =
      testing::reference_logits(model, stage_spec(0, kNumLayers, GetParam().use_graphs));
  Result<gguf::GgufFile> file = gguf::GgufFile::open(model.path);
  ASSERT_TRUE(file.ok());
  folio::testing::TemporaryDirectory directory;
  const std::vector<std::string> caches = {directory.path() + "/worker0",
                                           directory.path() + "/worker1"};

  const int64_t cold = run_cached_pipeline(model, caches, GetParam().use_graphs, expected);
  EXPECT_EQ(cold, shard_bytes(*file, 0, 2) + shard_bytes(*file, 2, kNumLayers));
  EXPECT_EQ(run_cached_pipeline(model, caches, GetParam().use_graphs, expected), 0);

  // One byte of one entry of stage 1's cache flipped on disk: only that tensor travels again.
  const gguf::GgufTensorInfo* victim = file->find_tensor("blk.3.ffn_down.weight");
  ASSERT_NE(victim, nullptr);
  Result<gguf::GgufTensor> victim_bytes = file->tensor(victim->name);
  ASSERT_TRUE(victim_bytes.ok());
  Result<std::unique_ptr<WeightCache>> cache = WeightCache::open(caches[1]);
  ASSERT_TRUE(cache.ok());
  const std::string entry = (*cache)->entry_path(ContentHash::of(victim_bytes->data));
  ASSERT_TRUE(std::filesystem::exists(entry));
  {
    std::fstream stream(entry, std::ios::in | std::ios::out | std::ios::binary);
    char byte = 0;
    stream.seekg(17);
    stream.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    stream.seekp(17);
    stream.write(&byte, 1);
  }
  EXPECT_EQ(run_cached_pipeline(model, caches, GetParam().use_graphs, expected),
            static_cast<int64_t>(victim->byte_size));
  EXPECT_EQ(run_cached_pipeline(model, caches, GetParam().use_graphs, expected), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, WeightCachePipelineTest,
                         ::testing::Values(CacheCase{DType::kF32, true},
                                           CacheCase{DType::kQ8_0, false}));

TEST(WeightCacheManifestTest, TiedLmHeadTravelsWithTheLastStage) {
  ModelOnDisk model(DType::kF16);
  // The same fixture, rewritten as a model whose LM head is its embedding table.
  model::LlamaShape shape;
  shape.num_layers = kNumLayers;
  shape.weight_dtype = DType::kF16;
  shape.tie_embeddings = true;
  ASSERT_TRUE(model::write_random_llama_model(model.path, shape, 43).ok());
  model.identity.hash = "fnv1a64:tied";
  Result<gguf::GgufFile> file = gguf::GgufFile::open(model.path);
  ASSERT_TRUE(file.ok());
  ASSERT_EQ(file->find_tensor("output.weight"), nullptr);
  ShardSource source(*file, model.identity.hash);
  Result<const ShardManifest*> last = source.manifest(model::LlamaShard{2, kNumLayers});
  ASSERT_TRUE(last.ok()) << last.status();
  std::set<std::string> names;
  for (const ShardTensor& tensor : (*last)->tensors) names.insert(tensor.name);
  EXPECT_EQ(names, shard_tensor_names(*file, 2, kNumLayers));
  EXPECT_TRUE(names.contains("token_embd.weight"));
  EXPECT_FALSE(names.contains("blk.1.attn_q.weight"));

  const std::vector<std::vector<float>> expected =
      testing::reference_logits(model, stage_spec(0, kNumLayers, true));
  folio::testing::TemporaryDirectory directory;
  EXPECT_EQ(run_cached_pipeline(model, {directory.path() + "/0", directory.path() + "/1"}, true,
                                expected),
            shard_bytes(*file, 0, 2) + shard_bytes(*file, 2, kNumLayers));
}

TEST(WeightCacheManifestTest, BytesThatDoNotMatchTheManifestHashAreRefused) {
  const ModelOnDisk model(DType::kF32);
  Result<gguf::GgufFile> file = gguf::GgufFile::open(model.path);
  ASSERT_TRUE(file.ok());
  ShardSource source(*file, model.identity.hash);
  Result<const ShardManifest*> made = source.manifest(model::LlamaShard{0, 2});
  ASSERT_TRUE(made.ok());
  ShardManifest manifest = **made;
  // The manifest claims other bytes for blk.0.attn_q.weight than the ones streamed.
  ShardTensor* lied = nullptr;
  for (ShardTensor& tensor : manifest.tensors) {
    if (tensor.name == "blk.0.attn_q.weight") lied = &tensor;
  }
  ASSERT_NE(lied, nullptr);
  const std::string other = "not the bytes of blk.0.attn_q.weight";
  lied->hash = ContentHash::of(std::as_bytes(std::span(other.data(), other.size())));

  folio::testing::TemporaryDirectory directory;
  auto service = start_cache_worker(directory.path());
  auto client = testing::connect_to(*service);
  Result<ShardOffer> offer = client->offer_shard(manifest);
  ASSERT_TRUE(offer.ok()) << offer.status();
  EXPECT_EQ(offer->missing.size(), manifest.tensors.size());
  EXPECT_EQ(offer->missing_bytes, manifest.tensor_bytes());
  Result<gguf::GgufTensor> real = file->tensor("blk.0.attn_q.weight");
  ASSERT_TRUE(real.ok());
  const TensorUpload upload{.hash = lied->hash, .bytes = real->data};
  Result<int64_t> pushed = client->push_tensors(std::span(&upload, 1));
  ASSERT_FALSE(pushed.ok());
  EXPECT_EQ(pushed.status().code(), StatusCode::kDataLoss) << pushed.status();
  EXPECT_THAT(std::string(pushed.status().message()), HasSubstr("blk.0.attn_q.weight"));
  EXPECT_THAT(std::string(pushed.status().message()),
              HasSubstr("the manifest's hash does not match the streamed bytes"));
  EXPECT_THAT(std::string(pushed.status().message()), HasSubstr(service->address()));
  Result<std::unique_ptr<WeightCache>> cache = WeightCache::open(directory.path());
  ASSERT_TRUE(cache.ok());
  EXPECT_FALSE((*cache)->contains(lied->hash));
  EXPECT_FALSE((*cache)->contains(ContentHash::of(real->data)));
  // Nothing to build the stage from: refused, saying what to do.
  Result<PreparedStage> prepared =
      client->prepare_stage(stage_spec(0, 2, true), model.identity.hash);
  ASSERT_FALSE(prepared.ok());
  EXPECT_EQ(prepared.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(prepared.status().message()), HasSubstr("weight cache"));
}

TEST(WeightCacheManifestTest, ShardOverTheWorkersMemoryBudgetIsRefusedAndFitsWithOneByteMore) {
  const ModelOnDisk model(DType::kF32);
  Result<gguf::GgufFile> file = gguf::GgufFile::open(model.path);
  ASSERT_TRUE(file.ok());
  ShardSource source(*file, model.identity.hash);
  const PipelineStageSpec spec = stage_spec(0, 2, true);
  const auto budget = static_cast<uint64_t>(shard_bytes(*file, 0, 2) + spec.pool_bytes - 1);
  folio::testing::TemporaryDirectory directory;
  auto service = start_cache_worker(directory.path(), budget);
  auto client = testing::connect_to(*service);
  ShardTransfer transfer;
  Result<PreparedStage> prepared = prepare_stage_with_weights(
      *client, &source, spec, model.identity.hash, kFirstEpoch, &transfer);
  EXPECT_EQ(transfer.bytes_fetched, shard_bytes(*file, 0, 2));
  ASSERT_FALSE(prepared.ok());
  EXPECT_EQ(prepared.status().code(), StatusCode::kResourceExhausted) << prepared.status();
  EXPECT_THAT(std::string(prepared.status().message()),
              HasSubstr(fmt::format("memory budget of {} bytes", budget)));
  // One byte more and it fits; the cache is warm by now.
  auto roomy = start_cache_worker(directory.path(), budget + 1);
  auto roomy_client = testing::connect_to(*roomy);
  prepared = prepare_stage_with_weights(*roomy_client, &source, spec, model.identity.hash,
                                        kFirstEpoch, &transfer);
  EXPECT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(transfer.bytes_fetched, 0);
}

TEST(WeightCacheManifestTest, MalformedManifestsAndWorkersWithoutACacheAreRefused) {
  const ModelOnDisk model(DType::kF32);
  Result<gguf::GgufFile> file = gguf::GgufFile::open(model.path);
  ASSERT_TRUE(file.ok());
  ShardSource source(*file, model.identity.hash);
  Result<const ShardManifest*> made = source.manifest(model::LlamaShard{0, 2});
  ASSERT_TRUE(made.ok());
  folio::testing::TemporaryDirectory directory;
  auto service = start_cache_worker(directory.path());
  auto client = testing::connect_to(*service);

  ShardManifest wrong_size = **made;
  wrong_size.tensors[0].byte_size += 4;
  Result<ShardOffer> refused = client->offer_shard(wrong_size);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr(wrong_size.tensors[0].name));

  ShardManifest wrong_layers = **made;
  wrong_layers.shard.end_layer = 3;
  EXPECT_EQ(client->offer_shard(wrong_layers).status().code(), StatusCode::kInvalidArgument);

  // Pushing before any offer.
  const TensorUpload upload{.hash = (*made)->tensors[0].hash, .bytes = {}};
  EXPECT_EQ(client->push_tensors(std::span(&upload, 1)).status().code(),
            StatusCode::kFailedPrecondition);

  // A worker with the model file, and one with neither file nor cache.
  auto with_model = testing::start_worker(model);
  Result<ShardOffer> file_worker = testing::connect_to(*with_model)->offer_shard(**made);
  EXPECT_EQ(file_worker.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(file_worker.status().message()), HasSubstr("takes no shard"));
  auto bare = testing::start_worker(model, 0, /*with_model=*/false);
  Result<ShardOffer> bare_worker = testing::connect_to(*bare)->offer_shard(**made);
  EXPECT_EQ(bare_worker.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bare_worker.status().message()), HasSubstr("--cache-dir"));
}

}  // namespace
}  // namespace folio::dist

// KV-parallel groups (issue 15, slice 6) against one process, in the same run: a generated model
// (8 layers, hidden 512, 8 heads of 64 over 4 KV heads, FFN 1536, vocabulary 4096, f16 weights,
// f16 KV, blocks of 16) and one sequence of 512 tokens whose last decode token (or last prefill
// chunk of 64) is run again and again (same positions, same slots: the work of that step at
// that context).
//   BM_KvParallelWhole: one executor whose cache holds all 512 positions, 1 thread;
//   BM_KvParallelKvp2:  two members of 256 positions each, each an executor of 1 thread
//                       (member 1 on a thread of its own), partial attention merged through the
//                       in-process group: two cores in all.
//   BM_KvParallelWorkers: the same two members as WorkerServices of this process (1 thread each)
//                       driven by a KvParallelStepRunner over gRPC, merging over gloo on
//                       loopback: the path of `--kv-parallel 2 --workers A,B`. Counters besides:
//                       the seconds per token member 0 spent in its all_gathers, and the
//                       coordinator's gRPC bytes per token.
// Counters: seconds per token, and for kvp2 the bytes member 0's all_gathers received per token
// (the other member's packed partials: layers x heads x (head_dim + 1) x 4, padded rows
// included). Every member
// computes the whole model but the attention, so KVP buys context length, not speed: the ratio
// kvp2 / whole says what the exchange and the repeated work cost.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "folio/base/check.h"
#include "folio/base/log.h"
#include "folio/dist/kv_parallel_step_runner.h"
#include "folio/dist/worker_service.h"
#include "testing/kv_parallel_group.h"
#include "testing/random_model_file.h"

namespace folio::dist {
namespace {

using folio::testing::KvParallelGroup;
using folio::testing::KvParallelGroupOptions;
using folio::testing::KvpStepArrays;
using folio::testing::ScriptSequence;

constexpr int32_t kTokensPerMember = 256;

struct KvParallelBench {
  std::unique_ptr<KvParallelGroup> group;
  std::vector<ScriptSequence> sequences;
  // The members on worker services (the group's model, written to a file).
  std::unique_ptr<folio::testing::RandomModelFile> model_file;
  std::vector<std::unique_ptr<WorkerService>> services;
  std::unique_ptr<KvParallelStepRunner> runner;

  KvParallelBench() {
    log::set_log_level("warn").ignore();
    KvParallelGroupOptions options;
    options.shape.vocab_size = 4096;
    options.shape.hidden_size = 512;
    options.shape.num_layers = 8;
    options.shape.num_heads = 8;
    options.shape.num_kv_heads = 4;
    options.shape.ffn_size = 1536;
    options.shape.context_length = 2 * kTokensPerMember;
    options.shape.weight_dtype = DType::kF16;
    options.kv_dtype = DType::kF16;
    options.block_size = 16;
    options.tokens_per_member = kTokensPerMember;
    options.blocks_per_page = kTokensPerMember / 16 + 4;  // a member's range and the padding
    options.member_pages = 1;
    options.max_sequences = 1;
    group = KvParallelGroup::create(options).value();
    sequences.resize(1);
    sequences[0].id = kv::SeqId(1);
    for (int32_t i = 0; i < 2 * kTokensPerMember; ++i) {
      sequences[0].tokens.push_back((i * 131 + 7) % 4096);
    }
    FOLIO_CHECK(group->allocate(sequences[0]).ok(), "allocate");
    start_workers(options);
    // Prefill positions [0, 448) in chunks of 64 through both; the benchmarks then run the
    // last 64 positions (a prefill chunk) or the last one (a decode) again and again.
    for (int32_t first = 0; first < 2 * kTokensPerMember - 64; first += 64) {
      const std::vector<kv::StepSegment> chunk = {{kv::SeqId(1), first, 64}};
      FOLIO_CHECK(group->whole().executor().execute(arrays(chunk, -1).batch()).ok(), "whole");
      FOLIO_CHECK(group->run_members(member_arrays(chunk)).ok(), "members");
      std::vector<KvpStepArrays> members = member_arrays(chunk);
      FOLIO_CHECK(run_workers(members).ok(), "workers");
    }
  }

  void start_workers(const KvParallelGroupOptions& options) {
    model_file =
        std::make_unique<folio::testing::RandomModelFile>(options.shape, options.model_seed);
    std::vector<std::unique_ptr<WorkerClient>> clients;
    for (int g = 0; g < 2; ++g) {
      WorkerServiceOptions service;
      service.threads = 1;
      service.model = model_file->identity;
      service.model_path = model_file->path;
      services.push_back(WorkerService::start(service).value());
      clients.push_back(
          WorkerClient::connect(services.back()->address(), model_file->identity).value());
    }
    PipelineStageSpec spec;
    spec.first_layer = 0;
    spec.end_layer = options.shape.num_layers;
    spec.num_kv_blocks = int64_t{options.blocks_per_page} * options.member_pages;
    spec.block_size = options.block_size;
    spec.max_blocks_per_sequence = group->member(0).max_blocks_per_sequence();
    spec.kv_dtype = options.kv_dtype;
    spec.first_dummy_block = group->member(0).manager().dummy_block().value();
    spec.num_dummy_blocks = options.num_dummy_blocks;
    spec.bucket_ladder = options.bucket_ladder;
    spec.max_sequences = options.max_sequences;
    spec.max_logit_rows = options.max_sequences;
    spec.use_graphs = true;
    spec.pool_bytes = int64_t{64} << 20;
    spec.collective_store = model_file->directory.path() + "/rendezvous";
    std::filesystem::create_directory(spec.collective_store);
    spec.collective_group_id = "kvp-bench";
    spec.kv_tokens_per_member = kTokensPerMember;
    runner =
        KvParallelStepRunner::create(std::move(clients), spec, model_file->identity.hash).value();
  }

  // One step through the worker members: member 0's arrays and each member's slots and tables.
  Result<ir::StepOutput> run_workers(const std::vector<KvpStepArrays>& members) {
    std::vector<ir::KvMemberArrays> views;
    for (const KvpStepArrays& member : members) {
      views.push_back({.slot_mapping = member.slot_mapping, .block_tables = member.block_tables});
    }
    ir::StepBatch step = members.front().batch();
    step.kv_members = views;
    return runner->run(step);
  }

  // The step of the sequence's last `tokens` positions (its logits row: the last token).
  static std::vector<kv::StepSegment> last(int32_t tokens) {
    return {{kv::SeqId(1), 2 * kTokensPerMember - tokens, tokens}};
  }
  KvpStepArrays arrays(const std::vector<kv::StepSegment>& segments, int32_t g) {
    return group->arrays(sequences, segments, g).value();
  }
  std::vector<KvpStepArrays> member_arrays(const std::vector<kv::StepSegment>& segments) {
    std::vector<KvpStepArrays> result;
    for (int32_t g = 0; g < 2; ++g) result.push_back(arrays(segments, g));
    return result;
  }
};

KvParallelBench& bench() {
  static KvParallelBench instance;
  return instance;
}

// Argument 0: tokens per step: 1 (a decode token at position 511) or 64 (the prefill chunk of
// positions [448, 512)).
void BM_KvParallelWhole(benchmark::State& state) {
  KvParallelBench& setup = bench();
  const auto tokens = static_cast<int32_t>(state.range(0));
  const KvpStepArrays arrays = setup.arrays(KvParallelBench::last(tokens), -1);
  const ir::StepBatch step = arrays.batch();
  for (auto _ : state) {
    Result<ir::StepOutput> output = setup.group->whole().executor().execute(step);
    FOLIO_CHECK(output.ok(), "{}", output.status());
    benchmark::DoNotOptimize(output->logits.data());
  }
  state.counters["seconds_per_token"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * tokens,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_KvParallelKvp2(benchmark::State& state) {
  KvParallelBench& setup = bench();
  const auto tokens = static_cast<int32_t>(state.range(0));
  const std::vector<KvpStepArrays> arrays = setup.member_arrays(KvParallelBench::last(tokens));
  const int64_t before = setup.group->received_bytes(0);
  for (auto _ : state) {
    Result<std::vector<float>> logits = setup.group->run_members(arrays);
    FOLIO_CHECK(logits.ok(), "{}", logits.status());
    benchmark::DoNotOptimize(logits->data());
  }
  const auto processed = static_cast<double>(state.iterations()) * tokens;
  state.counters["seconds_per_token"] =
      benchmark::Counter(processed, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["received_bytes_per_token"] =
      static_cast<double>(setup.group->received_bytes(0) - before) / processed;
}

void BM_KvParallelWorkers(benchmark::State& state) {
  KvParallelBench& setup = bench();
  const auto tokens = static_cast<int32_t>(state.range(0));
  const std::vector<KvpStepArrays> arrays = setup.member_arrays(KvParallelBench::last(tokens));
  const KvParallelTraffic before = setup.runner->traffic();
  for (auto _ : state) {
    Result<ir::StepOutput> output = setup.run_workers(arrays);
    FOLIO_CHECK(output.ok(), "{}", output.status());
    benchmark::DoNotOptimize(output->logits.data());
  }
  const KvParallelTraffic& after = setup.runner->traffic();
  const auto processed = static_cast<double>(state.iterations()) * tokens;
  state.counters["seconds_per_token"] =
      benchmark::Counter(processed, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["received_bytes_per_token"] =
      static_cast<double>(after.gathered_bytes - before.gathered_bytes) / processed;
  state.counters["communication_seconds_per_token"] =
      static_cast<double>(after.communication_ns - before.communication_ns) * 1e-9 / processed;
  state.counters["grpc_bytes_per_token"] =
      static_cast<double>(after.request_bytes + after.reply_bytes - before.request_bytes -
                          before.reply_bytes) /
      processed;
}

BENCHMARK(BM_KvParallelWhole)->Arg(1)->Arg(64)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_KvParallelKvp2)->Arg(1)->Arg(64)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_KvParallelWorkers)->Arg(1)->Arg(64)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace folio::dist

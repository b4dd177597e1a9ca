// KV cache quality on synthetic request traces, driven through the block manager by a minimal
// continuous-batching loop (admit while the watermark allows, prefill in one step, one decode
// token per running sequence per step, free when done, preempt the newest by recompute when an
// append finds no block). Each benchmark runs its trace once and reports counters:
//
//   BM_KvWaste/<block size>: 1,000 requests with log-normal prompt (median 256, 8..2048) and
//   output (median 192, 1..1024) lengths. waste_percent = allocated-but-unused token slots /
//   allocated slots, summed over steps (slots of running sequences' blocks vs their tokens).
//   BM_PrefixHitRate/<block size>/<capacity blocks>: 1,000 requests, each one of 8 system prompts
//   (200..800 tokens) followed by a 16..200-token user message. hit_rate_percent = prompt tokens
//   served from the prefix cache / prompt tokens; ideal_hit_percent = the same for an unbounded
//   cache holding every full block of every earlier prompt (the last token is always computed).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <random>
#include <unordered_set>
#include <vector>

#include "folio/base/check.h"
#include "folio/kv/block_manager.h"
#include "folio/kv/fixed_page_source.h"

namespace folio::kv {
namespace {

struct Request {
  std::vector<int32_t> prompt;
  int32_t output_length = 0;
  int32_t system_prompt = -1;  // index of the shared prefix, -1 for none
  int32_t shared_length = 0;
};

struct TraceResult {
  int64_t allocated_slot_steps = 0;
  int64_t used_slot_steps = 0;
  int64_t prompt_tokens = 0;
  int64_t hit_tokens = 0;
  int64_t steps = 0;
  int64_t preemptions = 0;
};

int32_t log_normal(std::mt19937& random, double median, double sigma, int32_t low, int32_t high) {
  std::lognormal_distribution<double> distribution(std::log(median), sigma);
  return std::clamp(static_cast<int32_t>(distribution(random)), low, high);
}

std::vector<Request> varied_trace(uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_int_distribution<int32_t> token(0, 31999);
  std::vector<Request> requests(1000);
  for (Request& request : requests) {
    request.prompt.resize(static_cast<size_t>(log_normal(random, 256, 0.8, 8, 2048)));
    for (int32_t& value : request.prompt) value = token(random);
    request.output_length = log_normal(random, 192, 0.8, 1, 1024);
  }
  return requests;
}

std::vector<Request> shared_prefix_trace(uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_int_distribution<int32_t> token(0, 31999);
  std::vector<std::vector<int32_t>> system_prompts(8);
  for (auto& system_prompt : system_prompts) {
    system_prompt.resize(static_cast<size_t>(std::uniform_int_distribution<int>(200, 800)(random)));
    for (int32_t& value : system_prompt) value = token(random);
  }
  std::vector<Request> requests(1000);
  for (Request& request : requests) {
    request.system_prompt = std::uniform_int_distribution<int>(0, 7)(random);
    request.prompt = system_prompts[request.system_prompt];
    request.shared_length = static_cast<int32_t>(request.prompt.size());
    const int32_t user = std::uniform_int_distribution<int>(16, 200)(random);
    for (int32_t index = 0; index < user; ++index) request.prompt.push_back(token(random));
    request.output_length = std::uniform_int_distribution<int>(16, 128)(random);
  }
  return requests;
}

struct Running {
  int64_t seq;
  size_t request;
  int32_t generated;
};

// One decode token for every running sequence; finished ones are freed. When an append finds
// no block, the newest sequence is preempted by recompute (it may be this one).
void decode_step(BlockManager& manager, const std::vector<Request>& requests,
                 std::vector<Running>& running, std::deque<size_t>& waiting, TraceResult& result) {
  for (size_t index = 0; index < running.size();) {
    Running& item = running[index];
    const AppendOutcome appended = *manager.append_slot(SeqId(item.seq), 7);
    if (appended.status != AppendStatus::kAppended) {
      const Running victim = running.back();
      running.pop_back();
      FOLIO_CHECK(manager.free(SeqId(victim.seq)).ok());
      waiting.push_front(victim.request);
      ++result.preemptions;
      continue;
    }
    FOLIO_CHECK(manager.mark_computed(SeqId(item.seq), *manager.num_tokens(SeqId(item.seq))).ok());
    if (++item.generated == requests[item.request].output_length) {
      FOLIO_CHECK(manager.free(SeqId(item.seq)).ok());
      running[index] = running.back();
      running.pop_back();
      continue;
    }
    ++index;
  }
}

TraceResult run_trace(const std::vector<Request>& requests, int32_t block_size,
                      int32_t capacity_blocks, size_t max_running) {
  ir::KvCacheGeometry geometry;
  geometry.block_size = block_size;
  geometry.num_layers = 1;
  geometry.num_kv_heads = 1;
  geometry.head_dim = 4;
  geometry.dtype = DType::kF32;
  FixedPageSource source(geometry.block_bytes() * 64, capacity_blocks / 64);
  HostKvBlockCopier copier;
  BlockManagerOptions options;
  options.geometry = geometry;
  options.max_context_tokens = 4096;
  std::unique_ptr<BlockManager> manager =
      std::move(BlockManager::create(options, source, copier)).value();
  TraceResult result;
  std::deque<size_t> waiting;
  for (size_t index = 0; index < requests.size(); ++index) waiting.push_back(index);
  std::vector<Running> running;
  int64_t next_seq = 0;
  while (!waiting.empty() || !running.empty()) {
    ++result.steps;
    while (!waiting.empty() && running.size() < max_running) {
      const Request& request = requests[waiting.front()];
      const SeqId seq(next_seq);
      const AllocateOutcome outcome = *manager->allocate(seq, request.prompt);
      if (outcome.admission != Admission::kAdmitted) break;
      ++next_seq;
      result.prompt_tokens += static_cast<int64_t>(request.prompt.size());
      result.hit_tokens += outcome.num_cached_tokens;
      FOLIO_CHECK(manager->mark_computed(seq, static_cast<int32_t>(request.prompt.size())).ok());
      running.push_back({seq.value(), waiting.front(), 0});
      waiting.pop_front();
    }
    decode_step(*manager, requests, running, waiting, result);
    for (const Running& item : running) {
      result.allocated_slot_steps +=
          static_cast<int64_t>(manager->block_table(SeqId(item.seq))->size()) * block_size;
      result.used_slot_steps += *manager->num_tokens(SeqId(item.seq));
    }
  }
  return result;
}

void BM_KvWaste(benchmark::State& state) {
  const auto block_size = static_cast<int32_t>(state.range(0));
  const std::vector<Request> requests = varied_trace(42);
  TraceResult result;
  for (auto _ : state) result = run_trace(requests, block_size, 1 << 16, 128);
  state.counters["waste_percent"] =
      100.0 * static_cast<double>(result.allocated_slot_steps - result.used_slot_steps) /
      static_cast<double>(result.allocated_slot_steps);
  state.counters["steps"] = static_cast<double>(result.steps);
  state.counters["preemptions"] = static_cast<double>(result.preemptions);
}

void BM_PrefixHitRate(benchmark::State& state) {
  const auto block_size = static_cast<int32_t>(state.range(0));
  const std::vector<Request> requests = shared_prefix_trace(7);
  TraceResult result;
  const auto capacity_blocks = static_cast<int32_t>(state.range(1));
  for (auto _ : state) result = run_trace(requests, block_size, capacity_blocks, 64);
  // An unbounded cache holding every full block of every earlier prompt.
  int64_t ideal = 0;
  std::unordered_set<uint64_t> cached;
  for (const Request& request : requests) {
    std::vector<uint64_t> keys;
    append_full_block_hashes(kRootPrefixHash, request.prompt, block_size, {}, keys);
    const size_t reusable = (request.prompt.size() - 1) / static_cast<size_t>(block_size);
    size_t hits = 0;
    while (hits < std::min(reusable, keys.size()) && cached.contains(keys[hits])) ++hits;
    ideal += static_cast<int64_t>(hits) * block_size;
    cached.insert(keys.begin(), keys.end());
  }
  state.counters["hit_rate_percent"] =
      100.0 * static_cast<double>(result.hit_tokens) / static_cast<double>(result.prompt_tokens);
  state.counters["ideal_hit_percent"] =
      100.0 * static_cast<double>(ideal) / static_cast<double>(result.prompt_tokens);
  state.counters["preemptions"] = static_cast<double>(result.preemptions);
}

BENCHMARK(BM_KvWaste)->Arg(8)->Arg(16)->Arg(32)->Iterations(1)->Unit(benchmark::kMillisecond);
// Capacity in blocks: ample (every system prompt stays cached), and tight (running sequences
// crowd the cache, so what the LRU keeps matters).
BENCHMARK(BM_PrefixHitRate)
    ->ArgsProduct({{8, 16, 32}, {32768, 2048}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace folio::kv

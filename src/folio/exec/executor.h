// Executor: the graph executor's facade (DESIGN.md, "One step of the engine", step 2-3).
//
//   execute(step):
//     validate the step (a malformed step is an error and changes nothing);
//     pad its token count up to a bucket (BucketPolicy); above the largest bucket, run eagerly;
//     write its arrays into the persistent input buffers and fill the padding;
//     look the bucket (padded tokens, phase) up in the graph cache: hit -> replay; miss ->
//     capture a program into a fresh view of the shared arena, cache it, replay it;
//     return the logits rows (valid until the next execute()).
//   Decode-only buckets capture one full graph; prefill buckets a piecewise program with
//   attention run eagerly between the pieces (program.h).
//
// The step graph of each bucket comes from an ir::GraphFactory (the model layer emits it for an
// ir::StepShape); the executor binds it to the weights, the paged KV cache and its own persistent
// buffers. Output tensors go to persistent output buffers sized for the largest bucket and
// shared by every program; the output named "logits" (f32 [R, vocab]) is returned.
//
// Thread-safety: one thread drives an executor (the engine loop). Several executors may share a
// MultiShapeArena and a ThreadPool from different threads: replays on the arena are serialized
// by its replay lock. The arena, pool, weights and KV memory must outlive the executor.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "folio/base/metrics.h"
#include "folio/base/result.h"
#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "folio/exec/attention_capture_hook.h"
#include "folio/exec/bucket_policy.h"
#include "folio/exec/graph_cache.h"
#include "folio/exec/multi_shape_arena.h"
#include "folio/exec/persistent_inputs.h"
#include "folio/exec/prepared_graph.h"
#include "folio/exec/step_limits.h"
#include "folio/exec/tensor_binding.h"
#include "folio/ir/graph.h"

namespace folio::exec {

enum class ExecutionMode : uint8_t {
  kGraph,  // capture once per bucket, then replay
  kEager,  // every step op by op, padded like kGraph (the reference)
};

struct ExecutorOptions {
  std::string name = "executor";  // metrics label; unique among the executors of one registry
  std::vector<int32_t> bucket_ladder = BucketPolicy::default_ladder();
  // Largest step accepted; steps above the largest bucket and up to this run eagerly.
  // 0: the largest bucket.
  int32_t max_num_tokens = 0;
  int32_t max_sequences = 0;   // required
  int32_t max_logit_rows = 0;  // 0: max_sequences
  // KV blocks reserved for padding tokens; they must hold the ladder's largest padding.
  int64_t first_dummy_block = 0;
  int32_t num_dummy_blocks = 1;
  ExecutionMode mode = ExecutionMode::kGraph;
  metrics::Registry* metrics = nullptr;  // may be null; must outlive the executor
  // Fault injection for tests (attention_capture_hook.h): called with the arguments of every
  // paged-attention launch captured, which it may rewrite. Null in the product; not owned, must
  // outlive the executor.
  AttentionCaptureHook* attention_capture_hook = nullptr;
};

enum class StepPath : uint8_t {
  kReplayed,             // cache hit
  kCapturedAndReplayed,  // cache miss
  kEager,                // ExecutionMode::kEager
  kEagerFallback,        // above the largest bucket, or no arena memory for a capture
};

struct ExecutorResources {
  ThreadPool& pool;
  MultiShapeArena& arena;
  const ir::WeightSource& weights;
  KvCacheBinding kv_cache;
  // The adapter table, for models whose graphs update projections with adapters; empty
  // otherwise. Must outlive the executor.
  AdapterTableBinding adapters = {};
};

class Executor {
 public:
  // Builds and prepares the largest bucket's graph to size the persistent buffers and to check
  // the model binds (weights, KV cache, inputs) before any step. Errors: bad options, or any
  // error of preparing that graph.
  static Result<std::unique_ptr<Executor>> create(ir::GraphFactory factory,
                                                  const ExecutorResources& resources,
                                                  ExecutorOptions options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The logits rows of `step` (valid until the next execute()).
  Result<ir::StepOutput> execute(const ir::StepBatch& step);
  // The padded shape the last executed step ran at, and how it ran.
  const ir::StepShape& last_step_shape() const { return last_step_shape_; }
  StepPath last_step_path() const { return last_step_path_; }

  // Captures the programs of every bucket of `phases` not cached yet, largest first, until
  // `time_budget_seconds` is spent; returns how many it captured.
  Result<int32_t> precapture(std::span<const ir::StepPhase> phases, double time_budget_seconds);

  GraphCacheStats stats() const { return cache_->stats(); }
  const GraphCache& cache() const { return *cache_; }
  const BucketPolicy& bucket_policy() const { return policy_; }
  const StepLimits& limits() const { return limits_; }
  // The stream steps run on (its launch counters tell eager launches from replayed kernels).
  const device::HostStream& stream() const { return stream_; }
  // The shape a step of `num_tokens` tokens runs at (padded unless above the largest bucket).
  ir::StepShape shape_for(int32_t num_tokens, ir::StepPhase phase) const;

 private:
  Executor(ir::GraphFactory factory, const ExecutorResources& resources, ExecutorOptions options,
           BucketPolicy policy);
  Status initialize();
  Result<std::unique_ptr<PreparedGraph>> prepare(const ir::StepShape& shape);
  // Output addresses (by tensor id) of `graph` in `buffers`, grown when `grow` is set.
  Result<std::vector<std::byte*>> output_addresses(
      const ir::Graph& graph, std::unordered_map<std::string, HostBuffer>& buffers, bool grow);
  Result<const Program*> capture(const ir::StepShape& shape);
  Status run_eagerly(const ir::StepShape& shape, ir::StepOutput& output);
  std::span<const float> logits_of(const std::unordered_map<std::string, HostBuffer>& buffers,
                                   int32_t rows) const;

  const ir::GraphFactory factory_;
  ThreadPool& pool_;
  MultiShapeArena& arena_;
  const ir::WeightSource& weights_;
  const KvCacheBinding kv_cache_;
  const AdapterTableBinding adapters_;
  const ExecutorOptions options_;
  const BucketPolicy policy_;
  StepLimits limits_;
  int64_t vocab_ = 0;
  device::HostStream stream_;
  std::unique_ptr<PersistentInputs> inputs_;
  std::unique_ptr<GraphCache> cache_;
  // Persistent outputs, by tensor name, sized for the largest bucket; programs write here.
  std::unordered_map<std::string, HostBuffer> persistent_outputs_;
  // Outputs of eager steps (any size up to max_num_tokens); no program points here.
  std::unordered_map<std::string, HostBuffer> eager_outputs_;
  // Prepared graphs of eager steps, by shape (bounded).
  std::unordered_map<ir::StepShape, std::unique_ptr<PreparedGraph>> eager_graphs_;
  std::vector<int64_t> validation_scratch_;
  bool attached_ = false;
  ir::StepShape last_step_shape_;
  StepPath last_step_path_ = StepPath::kEager;
};

}  // namespace folio::exec

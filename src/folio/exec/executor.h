// Executor: the graph executor's facade (DESIGN.md, "One step of the engine", step 2-3).
//
//   execute(step):
//     validate the step (a malformed step is an error and changes nothing);
//     pad its token count up to a bucket (BucketPolicy); above the largest bucket, run eagerly;
//     write its arrays into the persistent input buffers and fill the padding;
//     look the bucket (padded tokens, phase) up in the graph cache: hit -> replay; miss ->
//     capture a program into a fresh view of the shared arena, cache it, replay it;
//     return the logits rows (valid until the next execute()).
//   A pipeline stage's graphs (ir/step_graph.h) may read the residual stream (kInputHidden: one
//   more persistent input, written from execute()'s `hidden_in`) and output it (kOutputHidden:
//   returned as StepOutput::hidden, like logits) instead of embedding tokens or emitting logits.
//   Decode-only buckets capture one full graph; prefill buckets a piecewise program with
//   attention run eagerly between the pieces (program.h).
//
// The step graph of each bucket comes from an ir::GraphFactory (the model layer emits it for an
// ir::StepShape); the executor binds it to the weights, the paged KV cache and its own persistent
// buffers. Output tensors go to persistent output buffers sized for the largest bucket and
// shared by every program; the output named "logits" (f32 [R, vocab]) is returned.
//
// Memory (issue 14, "everything inside the one budget"): every byte a step uses comes from the
// page pool (step_memory.h): the persistent input and output buffers are pinned pool memory,
// captured programs' activations live in the graph arena (pool pages), and an eager step plans
// its activations and workspaces (plan_step_activations) into a pool region grown to the
// largest eager step seen. When the pool cannot give an eager step its memory, the step fails
// with kResourceExhausted and the pool holds no more pages than before. release_idle_memory()
// drops the programs of buckets not used for a while, shrinks the arena to the largest capture
// left, and gives back the eager region when no eager step ran for as long; what was dropped is
// captured (or allocated) again the next time a step needs it. The constants a prepared
// graph keeps (prepared_graph.h: RoPE factors, a few hundred bytes per graph) stay on the heap:
// model-lifetime constants, counted with the weights, not the pool.
//
// Thread-safety: one thread drives an executor (the engine loop). Several executors may share a
// MultiShapeArena and a ThreadPool from different threads: replays on the arena are serialized
// by its replay lock. The arena, pool, weights and KV memory must outlive the executor.
#pragma once

#include <chrono>
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
#include "folio/exec/op_profile.h"
#include "folio/exec/persistent_inputs.h"
#include "folio/exec/prepared_graph.h"
#include "folio/exec/step_collectives.h"
#include "folio/exec/step_limits.h"
#include "folio/exec/step_memory.h"
#include "folio/exec/tensor_binding.h"
#include "folio/ir/buffer_plan.h"
#include "folio/ir/graph.h"
#include "folio/memory/page_pool.h"

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
  // The group this executor is a member of (step_collectives.h), for graphs with collective
  // ops (tensor parallelism's all_reduce_sum); null: none, and such graphs are refused. A
  // failed collective fails the step (execute returns its status). Not owned; must outlive the
  // executor; used from the executor's thread only.
  StepCollectives* collectives = nullptr;
  // Per-op timing (op_profile.h): every kernel the executor runs, eager or replayed, is timed
  // and charged to its op's row, and the executor's input preparation and captures to theirs.
  // Null: nothing is timed. Not owned; must outlive the executor; driven by the executor's
  // thread.
  OpProfile* profile = nullptr;
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
  // The one memory budget: persistent buffers and eager steps' memory come from here (usually
  // the pool the arena's pages come from too).
  memory::PagePool& page_pool;
  const ir::WeightSource& weights;
  KvCacheBinding kv_cache;
  // The adapter table, for models whose graphs update projections with adapters; empty
  // otherwise. Must outlive the executor.
  AdapterTableBinding adapters = {};
};

class Executor {
 public:
  // Builds and prepares the largest bucket's graph to size the persistent buffers and to check
  // the model binds (weights, KV cache, inputs) before any step. Errors: bad options, any
  // error of preparing that graph, or no pool pages for the persistent buffers
  // (kResourceExhausted).
  static Result<std::unique_ptr<Executor>> create(ir::GraphFactory factory,
                                                  const ExecutorResources& resources,
                                                  ExecutorOptions options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The logits rows of `step` (valid until the next execute()), or for a stage that is not the
  // last, the residual stream of its tokens. `hidden_in`: the residual stream entering a stage
  // that is not the first, f32 [step tokens, hidden_size()]; empty for the first.
  // kInvalidArgument for a malformed step or hidden_in (nothing ran); kResourceExhausted when
  // an eager step finds no pool memory for its activations or outputs (the step did not run).
  Result<ir::StepOutput> execute(const ir::StepBatch& step, std::span<const float> hidden_in = {});
  // The padded shape the last executed step ran at, and how it ran.
  const ir::StepShape& last_step_shape() const { return last_step_shape_; }
  StepPath last_step_path() const { return last_step_path_; }

  // Captures the programs of every bucket of `phases` not cached yet, largest first, until
  // `time_budget_seconds` is spent; returns how many it captured.
  Result<int32_t> precapture(std::span<const ir::StepPhase> phases, double time_budget_seconds);

  // Gives idle memory back to the page pool: drops the cached programs of buckets not used
  // (captured or replayed) in the last `idle_steps` steps of this executor (0: every program),
  // releases their arena views and shrinks the arena to the largest capture left (of any
  // executor sharing it); and when no eager step ran in those steps, frees the eager steps'
  // activation region and output buffers. Returns the bytes given back to the pool. Dropped
  // buckets are captured again on their next step. kInvalidArgument for a negative
  // `idle_steps` (nothing dropped); the arena's errors otherwise.
  Result<int64_t> release_idle_memory(int64_t idle_steps);
  // Bytes of activations and workspaces a step of `num_tokens` tokens needs (the lifetime
  // plan's peak, before rounding to pool pages): what an eager step of that size takes from the
  // pool, and what a capture of its bucket needs in the arena. For a scheduler that sizes steps
  // to the memory left. Errors: those of building and preparing the step's graph.
  Result<int64_t> step_activation_bytes(int32_t num_tokens, ir::StepPhase phase);
  // Bytes of weights a step of `num_tokens` tokens reads (ir::weight_bytes_read of its graph):
  // for one decode token, what each decode step streams from memory at least. Errors: those of
  // building and preparing the step's graph.
  Result<int64_t> step_weight_bytes(int32_t num_tokens, ir::StepPhase phase);
  // Pool bytes held for eager steps: their activation region and their output buffers.
  size_t eager_pool_bytes() const {
    return eager_scratch_.size_bytes() + eager_outputs_.pool_bytes();
  }
  // Steps executed so far (the clock release_idle_memory measures idleness in).
  int64_t steps_executed() const { return steps_; }

  GraphCacheStats stats() const { return cache_->stats(); }
  const GraphCache& cache() const { return *cache_; }
  const BucketPolicy& bucket_policy() const { return policy_; }
  // Width of the residual stream the graphs read (0: they embed token ids) and write (0: they
  // emit logits).
  int64_t hidden_input_size() const { return limits_.hidden_size; }
  int64_t hidden_output_size() const { return hidden_output_size_; }
  // Columns of the logits; 0 for a stage that outputs the residual stream instead.
  int64_t vocab_size() const { return vocab_; }
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
  // What preparing a graph of this executor binds: its weights, KV cache, inputs, adapters,
  // threads and group.
  PrepareContext prepare_context();
  Result<const Program*> capture(const ir::StepShape& shape);
  Status run_eagerly(const ir::StepShape& shape, int32_t num_tokens, ir::StepOutput& output);
  struct EagerGraph;
  // The prepared graph and plan of `shape`, from eager_graphs_ or made now.
  Result<const EagerGraph*> eager_graph(const ir::StepShape& shape);
  // Points `output` at the logits (or hidden rows) of `buffers`.
  void set_output(const OutputBuffers& buffers, int32_t num_tokens, ir::StepOutput& output) const;
  static double seconds_since(std::chrono::steady_clock::time_point start);

  // A prepared graph of an eager step and the plan of its activations.
  struct EagerGraph {
    std::unique_ptr<PreparedGraph> graph;
    ir::BufferPlan plan;
  };

  const ir::GraphFactory factory_;
  ThreadPool& pool_;
  MultiShapeArena& arena_;
  memory::PagePool& page_pool_;
  const ir::WeightSource& weights_;
  const KvCacheBinding kv_cache_;
  const AdapterTableBinding adapters_;
  const ExecutorOptions options_;
  const BucketPolicy policy_;
  StepLimits limits_;
  int64_t vocab_ = 0;               // columns of the logits; 0 for a stage without logits
  int64_t hidden_output_size_ = 0;  // columns of kOutputHidden; 0 for graphs with logits
  device::HostStream stream_;
  std::unique_ptr<PersistentInputs> inputs_;
  std::unique_ptr<GraphCache> cache_;
  // Persistent outputs, by tensor name, sized for the largest bucket; programs write here.
  OutputBuffers persistent_outputs_;
  // Outputs of eager steps (any size up to max_num_tokens); no program points here.
  OutputBuffers eager_outputs_;
  // Activations and workspaces of eager steps, grown to the largest eager step since the last
  // release.
  PoolRegion eager_scratch_;
  // Prepared graphs of eager steps, by shape (bounded).
  std::unordered_map<ir::StepShape, EagerGraph> eager_graphs_;
  int64_t steps_ = 0;
  int64_t last_eager_step_ = 0;
  std::vector<int64_t> validation_scratch_;
  bool attached_ = false;
  CollectiveFailures collective_failures_;  // of the step running; empty between steps
  ir::StepShape last_step_shape_;
  StepPath last_step_path_ = StepPath::kEager;
};

}  // namespace folio::exec

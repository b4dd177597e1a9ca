#include "folio/exec/executor.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "folio/base/log.h"
#include "folio/exec/eager_runner.h"
#include "folio/ir/cost.h"

namespace folio::exec {
namespace {

constexpr size_t kMaxEagerGraphs = 16;

// The vocabulary size the step's token ids are checked against: rows of the embedding table.
int64_t vocab_of(const ir::Graph& graph) {
  for (const ir::Op& op : graph.ops()) {
    if (op.kind == ir::OpKind::kEmbedding) {
      return graph.tensor(op.inputs[static_cast<size_t>(ir::embedding_input::kTable)]).shape[0];
    }
  }
  return std::numeric_limits<int32_t>::max();
}

Status check_options(const ExecutorOptions& options, const BucketPolicy& policy,
                     const KvCacheBinding& kv_cache) {
  if (options.max_sequences <= 0) {
    return invalid_argument("executor '{}': max_sequences must be positive", options.name);
  }
  if (options.max_num_tokens != 0 && options.max_num_tokens < policy.largest()) {
    return invalid_argument("executor '{}': max_num_tokens {} is below the largest bucket {}",
                            options.name, options.max_num_tokens, policy.largest());
  }
  const int64_t dummy_slots = int64_t{options.num_dummy_blocks} * kv_cache.layout.block_size;
  if (policy.max_padding() > dummy_slots) {
    return invalid_argument(
        "executor '{}': the bucket ladder pads up to {} tokens but the {} padding blocks hold "
        "{} slots; reserve more padding blocks or use a finer ladder",
        options.name, policy.max_padding(), options.num_dummy_blocks, dummy_slots);
  }
  return Status();
}

// A KV-parallel member's graphs (partial attention, dist.md "KV-parallel groups") fix the
// positions its cache holds; every attention op of the graph must agree on them.
Status read_kv_range(const ir::Graph& graph, StepLimits& limits) {
  bool found = false;
  for (const ir::Op& op : graph.ops()) {
    if (op.kind != ir::OpKind::kPagedAttention) continue;
    const auto& attributes = std::get<ir::AttentionAttributes>(op.attributes);
    if (!found) {
      limits.kv_range_begin = attributes.kv_range_begin;
      limits.kv_range_end = attributes.kv_range_end;
      found = true;
    } else if (attributes.kv_range_begin != limits.kv_range_begin ||
               attributes.kv_range_end != limits.kv_range_end) {
      return invalid_argument(
          "attention '{}' reads KV positions [{}, {}), an earlier one [{}, {}): a graph's "
          "attention ops must share one KV-parallel range",
          op.name, attributes.kv_range_begin, attributes.kv_range_end, limits.kv_range_begin,
          limits.kv_range_end);
    }
  }
  return Status();
}

}  // namespace

Executor::Executor(ir::GraphFactory factory, const ExecutorResources& resources,
                   ExecutorOptions options, BucketPolicy policy)
    : factory_(std::move(factory)),
      pool_(resources.pool),
      arena_(resources.arena),
      page_pool_(resources.page_pool),
      weights_(resources.weights),
      kv_cache_(resources.kv_cache),
      adapters_(resources.adapters),
      options_(std::move(options)),
      policy_(std::move(policy)),
      stream_(resources.pool),
      persistent_outputs_(resources.page_pool, "the persistent output buffers"),
      eager_outputs_(resources.page_pool, "the output buffers of eager steps"),
      eager_scratch_(resources.page_pool, memory::ContentType::kActivation,
                     "the activations of an eager step") {
  stream_.set_observer(options_.profile);
}

Result<std::unique_ptr<Executor>> Executor::create(ir::GraphFactory factory,
                                                   const ExecutorResources& resources,
                                                   ExecutorOptions options) {
  FOLIO_ASSIGN_OR_RETURN(BucketPolicy policy, BucketPolicy::create(options.bucket_ladder));
  FOLIO_RETURN_IF_ERROR(check_options(options, policy, resources.kv_cache));
  FOLIO_RETURN_IF_ERROR(resources.kv_cache.layout.validate());
  std::unique_ptr<Executor> executor(
      new Executor(std::move(factory), resources, std::move(options), std::move(policy)));
  FOLIO_RETURN_IF_ERROR(executor->initialize());
  return executor;
}

Status Executor::initialize() {
  limits_.max_tokens = options_.max_num_tokens == 0 ? policy_.largest() : options_.max_num_tokens;
  limits_.max_sequences = options_.max_sequences;
  limits_.max_logit_rows =
      options_.max_logit_rows == 0 ? options_.max_sequences : options_.max_logit_rows;
  limits_.max_blocks_per_sequence = 0;  // from the graph below
  limits_.num_kv_blocks = kv_cache_.num_blocks;
  limits_.block_size = kv_cache_.layout.block_size;
  limits_.first_dummy_block = options_.first_dummy_block;
  limits_.num_dummy_blocks = options_.num_dummy_blocks;
  limits_.num_adapter_slots = adapters_.num_slots;

  // The largest bucket's graph sizes what must be known before the first capture.
  const ir::StepShape largest = shape_for(policy_.largest(), ir::StepPhase::kDecode);
  Result<ir::Graph> graph = factory_(largest);
  if (!graph.ok()) return graph.status().with_context("building the largest bucket's graph");
  limits_.vocab_size = vocab_of(*graph);
  if (const std::optional<ir::TensorId> hidden = graph->find_tensor(ir::kInputHidden)) {
    limits_.hidden_size = graph->tensor(*hidden).shape[1];
  }
  if (const std::optional<ir::TensorId> tables = graph->find_tensor(ir::kInputBlockTables)) {
    limits_.max_blocks_per_sequence = static_cast<int32_t>(graph->tensor(*tables).shape[1]);
  } else {
    limits_.max_blocks_per_sequence = 1;
  }
  FOLIO_RETURN_IF_ERROR(read_kv_range(*graph, limits_));
  FOLIO_ASSIGN_OR_RETURN(inputs_, PersistentInputs::create(limits_, page_pool_));
  validation_scratch_.reserve(static_cast<size_t>(limits_.max_tokens));  // steps never allocate
  const std::optional<ir::TensorId> logits = graph->find_tensor(ir::kOutputLogits);
  const std::optional<ir::TensorId> hidden_out = graph->find_tensor(ir::kOutputHidden);
  auto is_output = [&](std::optional<ir::TensorId> tensor) {
    return tensor && graph->tensor(*tensor).residency == ir::Residency::kOutput;
  };
  if (is_output(logits) == is_output(hidden_out)) {
    return invalid_argument("the step graph must have exactly one output named '{}' or '{}'",
                            ir::kOutputLogits, ir::kOutputHidden);
  }
  if (is_output(logits)) {
    vocab_ = graph->tensor(*logits).shape[1];
  } else {
    hidden_output_size_ = graph->tensor(*hidden_out).shape[1];
  }
  FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<PreparedGraph> prepared,
                         PreparedGraph::prepare(std::move(graph).value(), prepare_context()));
  FOLIO_RETURN_IF_ERROR(persistent_outputs_.bind(prepared->graph(), true).status());
  FOLIO_ASSIGN_OR_RETURN(cache_, GraphCache::create(options_.metrics, options_.name));
  arena_.attach();
  attached_ = true;
  return Status();
}

Executor::~Executor() {
  cache_.reset();  // programs first: they hold views of the arena
  if (attached_) arena_.detach();
}

ir::StepShape Executor::shape_for(int32_t num_tokens, ir::StepPhase phase) const {
  const int32_t tokens = policy_.padded_size(num_tokens).value_or(num_tokens);
  const int32_t max_logit_rows =
      options_.max_logit_rows == 0 ? options_.max_sequences : options_.max_logit_rows;
  return ir::StepShape{tokens, std::min(tokens, options_.max_sequences),
                       std::min(tokens, max_logit_rows), phase};
}

Result<std::unique_ptr<PreparedGraph>> Executor::prepare(const ir::StepShape& shape) {
  Result<ir::Graph> graph = factory_(shape);
  if (!graph.ok()) {
    return graph.status().with_context(fmt::format("building the step graph for {} tokens ({})",
                                                   shape.num_tokens,
                                                   ir::step_phase_name(shape.phase)));
  }
  return PreparedGraph::prepare(std::move(graph).value(), prepare_context());
}

PrepareContext Executor::prepare_context() {
  return PrepareContext{weights_,
                        kv_cache_,
                        *inputs_,
                        adapters_,
                        pool_.num_threads(),
                        options_.collectives,
                        &collective_failures_};
}

Result<const Program*> Executor::capture(const ir::StepShape& shape) {
  FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<PreparedGraph> prepared, prepare(shape));
  FOLIO_ASSIGN_OR_RETURN(const std::vector<std::byte*> outputs,
                         persistent_outputs_.bind(prepared->graph(), false));
  CaptureOptions capture_options;
  capture_options.kind =
      shape.phase == ir::StepPhase::kDecode ? ProgramKind::kFullGraph : ProgramKind::kPiecewise;
  capture_options.attention_hook = options_.attention_capture_hook;
  FOLIO_ASSIGN_OR_RETURN(
      std::unique_ptr<Program> program,
      capture_program(std::move(prepared), arena_, outputs, stream_, capture_options));
  cache_->record_capture(program->capture_seconds());
  return cache_->insert(BucketKey{shape.num_tokens, shape.phase}, std::move(program), steps_);
}

Result<const Executor::EagerGraph*> Executor::eager_graph(const ir::StepShape& shape) {
  auto found = eager_graphs_.find(shape);
  if (found == eager_graphs_.end()) {
    if (eager_graphs_.size() >= kMaxEagerGraphs) eager_graphs_.clear();
    EagerGraph eager;
    FOLIO_ASSIGN_OR_RETURN(eager.graph, prepare(shape));
    FOLIO_ASSIGN_OR_RETURN(eager.plan, plan_step_activations(*eager.graph));
    found = eager_graphs_.emplace(shape, std::move(eager)).first;
  }
  return &found->second;
}

Result<int64_t> Executor::step_activation_bytes(int32_t num_tokens, ir::StepPhase phase) {
  if (num_tokens < 1 || num_tokens > limits_.max_tokens) {
    return invalid_argument("executor '{}': a step of {} tokens is outside [1, {}]", options_.name,
                            num_tokens, limits_.max_tokens);
  }
  FOLIO_ASSIGN_OR_RETURN(const EagerGraph* eager, eager_graph(shape_for(num_tokens, phase)));
  return eager->plan.peak_bytes;
}

Result<int64_t> Executor::step_weight_bytes(int32_t num_tokens, ir::StepPhase phase) {
  if (num_tokens < 1 || num_tokens > limits_.max_tokens) {
    return invalid_argument("executor '{}': a step of {} tokens is outside [1, {}]", options_.name,
                            num_tokens, limits_.max_tokens);
  }
  FOLIO_ASSIGN_OR_RETURN(const EagerGraph* eager, eager_graph(shape_for(num_tokens, phase)));
  return ir::weight_bytes_read(eager->graph->graph());
}

Status Executor::run_eagerly(const ir::StepShape& shape, int32_t num_tokens,
                             ir::StepOutput& output) {
  FOLIO_ASSIGN_OR_RETURN(const EagerGraph* found, eager_graph(shape));
  const EagerGraph& eager = *found;
  const size_t output_bytes_before = eager_outputs_.pool_bytes();
  FOLIO_ASSIGN_OR_RETURN(const std::vector<std::byte*> outputs,
                         eager_outputs_.bind(eager.graph->graph(), true));
  const auto scratch_bytes = static_cast<size_t>(eager.plan.peak_bytes);
  if (const Status grown = eager_scratch_.grow_to(scratch_bytes); !grown.ok()) {
    // A failed step holds no more pool pages than before it: output pages grown for it go.
    eager_outputs_.truncate_to(output_bytes_before);
    log::debug("executor '{}': an eager step of {} tokens found no pool memory: {}", options_.name,
               shape.num_tokens, grown.to_string());
    return grown;
  }
  last_eager_step_ = steps_;
  FOLIO_RETURN_IF_ERROR(run_eager(*eager.graph, eager.plan,
                                  std::span<std::byte>(eager_scratch_.data(), scratch_bytes),
                                  outputs, stream_));
  set_output(eager_outputs_, num_tokens, output);
  return Status();
}

void Executor::set_output(const OutputBuffers& buffers, int32_t num_tokens,
                          ir::StepOutput& output) const {
  if (hidden_output_size_ > 0) {
    const PoolSlice hidden = buffers.find(ir::kOutputHidden);
    FOLIO_CHECK(hidden.data() != nullptr, "no hidden output buffer");
    output.hidden = std::span<const float>(
        hidden.as<const float>(), static_cast<size_t>(int64_t{num_tokens} * hidden_output_size_));
    output.hidden_size = hidden_output_size_;
    return;
  }
  const PoolSlice logits = buffers.find(ir::kOutputLogits);
  FOLIO_CHECK(logits.data() != nullptr, "no logits buffer");
  output.logits = std::span<const float>(logits.as<const float>(),
                                         static_cast<size_t>(int64_t{output.num_rows} * vocab_));
}

double Executor::seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Result<ir::StepOutput> Executor::execute(const ir::StepBatch& step,
                                         std::span<const float> hidden_in) {
  OpProfile* const profile = options_.profile;
  const auto start = profile != nullptr ? std::chrono::steady_clock::now()
                                        : std::chrono::steady_clock::time_point();
  FOLIO_RETURN_IF_ERROR(validate_step(step, limits_, validation_scratch_));
  const auto hidden_values = static_cast<size_t>(int64_t{step.num_tokens()} * limits_.hidden_size);
  if (hidden_in.size() != hidden_values) {
    return invalid_argument(
        "executor '{}': the step's hidden input has {} values; this {} {} ({} tokens of {})",
        options_.name, hidden_in.size(),
        limits_.hidden_size > 0 ? "pipeline stage reads" : "graph embeds token ids and reads",
        hidden_values, step.num_tokens(), limits_.hidden_size);
  }
  ++steps_;
  const int32_t tokens = step.num_tokens();
  const bool above_ladder = tokens > policy_.largest();
  ir::StepOutput output;
  output.num_rows = step.num_logit_rows();
  output.vocab_size = static_cast<int32_t>(vocab_);
  last_step_shape_ = shape_for(tokens, step.phase());
  const ir::StepShape& shape = last_step_shape_;
  inputs_->write(step, shape, hidden_in);
  cache_->record_tokens(tokens, shape.num_tokens - tokens);
  if (profile != nullptr) profile->add(ProfileRow::kInputPreparation, seconds_since(start));
  if (above_ladder || options_.mode == ExecutionMode::kEager) {
    if (above_ladder) cache_->record_eager_fallback();
    last_step_path_ = above_ladder ? StepPath::kEagerFallback : StepPath::kEager;
    FOLIO_RETURN_IF_ERROR(run_eagerly(shape, tokens, output));
    FOLIO_RETURN_IF_ERROR(collective_failures_.take());
    return output;
  }
  const BucketKey key{shape.num_tokens, shape.phase};
  const Program* program = cache_->use(key, steps_);
  last_step_path_ = StepPath::kReplayed;
  if (program != nullptr) {
    cache_->record_hit();
  } else {
    cache_->record_miss();
    const auto capture_start = profile != nullptr ? std::chrono::steady_clock::now()
                                                  : std::chrono::steady_clock::time_point();
    Result<const Program*> captured = capture(shape);
    if (profile != nullptr) profile->add(ProfileRow::kGraphCapture, seconds_since(capture_start));
    if (!captured.ok() && captured.status().code() == StatusCode::kResourceExhausted) {
      // No memory for the arena right now: this step runs eagerly, a later one retries.
      log::debug("executor '{}': {}; running eagerly", options_.name,
                 captured.status().to_string());
      cache_->record_capture_failure();
      last_step_path_ = StepPath::kEagerFallback;
      FOLIO_RETURN_IF_ERROR(run_eagerly(shape, tokens, output));
      FOLIO_RETURN_IF_ERROR(collective_failures_.take());
      return output;
    }
    FOLIO_ASSIGN_OR_RETURN(program, std::move(captured));
    last_step_path_ = StepPath::kCapturedAndReplayed;
  }
  {
    const ArenaReplayLock lock = arena_.lock_for_replay();
    program->replay(stream_, lock);
  }
  FOLIO_RETURN_IF_ERROR(collective_failures_.take());
  set_output(persistent_outputs_, tokens, output);
  return output;
}

Result<int64_t> Executor::release_idle_memory(int64_t idle_steps) {
  if (idle_steps < 0) {
    return invalid_argument("executor '{}': idle steps must be 0 or more, got {}", options_.name,
                            idle_steps);
  }
  std::vector<std::unique_ptr<Program>> idle = cache_->take_idle(steps_, idle_steps);
  Status status;
  for (const std::unique_ptr<Program>& program : idle) {
    // The program goes right after; nothing replays through its view any more.
    const Status released = arena_.release_view(program->view());
    if (status.ok() && !released.ok()) status = released;
  }
  const auto dropped = static_cast<int64_t>(idle.size());
  idle.clear();
  FOLIO_RETURN_IF_ERROR(status);
  FOLIO_ASSIGN_OR_RETURN(const size_t arena_bytes, arena_.shrink_to_largest_view());
  size_t eager_bytes = 0;
  if (steps_ - last_eager_step_ >= idle_steps) {
    eager_bytes = eager_scratch_.size_bytes() + eager_outputs_.pool_bytes();
    eager_scratch_.truncate_to(0);
    eager_outputs_.truncate_to(0);
    eager_graphs_.clear();
  }
  const auto bytes = static_cast<int64_t>(arena_bytes + eager_bytes);
  cache_->record_release(dropped, bytes);
  if (bytes > 0) {
    log::debug("executor '{}': dropped {} idle programs, gave {} B back ({} B of graph arena)",
               options_.name, dropped, bytes, arena_bytes);
  }
  return bytes;
}

Result<int32_t> Executor::precapture(std::span<const ir::StepPhase> phases,
                                     double time_budget_seconds) {
  const auto start = std::chrono::steady_clock::now();
  int32_t captured = 0;
  std::vector<int32_t> sizes = policy_.ladder();
  std::reverse(sizes.begin(), sizes.end());  // largest first: the arena reaches its size at once
  for (int32_t size : sizes) {
    for (ir::StepPhase phase : phases) {
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (elapsed >= time_budget_seconds) return captured;
      if (cache_->find(BucketKey{size, phase}) != nullptr) continue;
      FOLIO_RETURN_IF_ERROR(capture(shape_for(size, phase)).status());
      ++captured;
    }
  }
  return captured;
}

}  // namespace folio::exec

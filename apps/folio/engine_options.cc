#include "apps/folio/engine_options.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <type_traits>

#include "apps/folio/local_workers.h"
#include "apps/folio/model_hash.h"
#include "apps/folio/progress_bar.h"
#include "folio/base/mutex.h"
#include "folio/base/random.h"
#include "folio/base/read_bandwidth.h"
#include "folio/dist/kv_parallel_step_runner.h"
#include "folio/dist/pipeline_plan.h"
#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/tensor_parallel_plan.h"
#include "folio/dist/tensor_parallel_step_runner.h"
#include "folio/model/llama_graph.h"

namespace folio::app {
namespace {

// The local workers of --local-workers: started with the engine, stopped when the process
// ends (static destruction after the command returns, or the workers' --parent-pid when it
// dies).
std::unique_ptr<LocalWorkers>& local_worker_group() {
  static std::unique_ptr<LocalWorkers> group;
  return group;
}

// What the pipeline runner of this process's engine sent and received, as of its last step;
// nullopt without workers. Written by the engine's thread, read by the command's.
struct RecordedTraffic {
  Mutex mutex;
  std::optional<dist::PipelineTraffic> traffic FOLIO_GUARDED_BY(mutex);
};
RecordedTraffic& recorded_traffic() {
  static RecordedTraffic recorded;
  return recorded;
}

// The same for a worker group's runner (tensor-parallel ranks, KV-parallel members), one slot
// per kind of traffic.
template <typename Traffic>
struct RecordedGroupTraffic {
  Mutex mutex;
  std::optional<Traffic> traffic FOLIO_GUARDED_BY(mutex);
};
template <typename Traffic>
RecordedGroupTraffic<Traffic>& recorded_group_traffic() {
  static RecordedGroupTraffic<Traffic> recorded;
  return recorded;
}

// The engine's runner over a worker group (Runner: TensorParallelStepRunner or
// KvParallelStepRunner), recording its traffic after every step.
template <typename Runner>
class InstrumentedGroupRunner final : public engine::StepRunner {
 public:
  explicit InstrumentedGroupRunner(std::unique_ptr<Runner> runner) : runner_(std::move(runner)) {
    record();
  }
  Result<ir::StepOutput> run(const ir::StepBatch& step) override {
    Result<ir::StepOutput> output = runner_->run(step);
    record();
    return output;
  }
  Status copy_blocks(std::span<const kv::BlockCopy> copies) override {
    return runner_->copy_blocks(copies);
  }
  int32_t vocab_size() const override { return runner_->vocab_size(); }
  int32_t max_logit_rows() const override { return runner_->max_logit_rows(); }

 private:
  void record() {
    using Traffic = std::decay_t<decltype(runner_->traffic())>;
    RecordedGroupTraffic<Traffic>& recorded = recorded_group_traffic<Traffic>();
    const MutexLock lock(recorded.mutex);
    recorded.traffic = runner_->traffic();
  }
  std::unique_ptr<Runner> runner_;
};

// Kills a local worker every `every` steps (SIGKILL, a random one of the group), `rounds` times:
// --kill-local-worker-every, to watch the recovery of issue 16 work on a real run.
struct WorkerKiller {
  int32_t every = 0;  // 0: never
  int32_t rounds = 0;
  uint64_t seed = 0;
};

// The engine's runner over the pipeline: the PipelineStepRunner, recording its traffic after
// every step for pipeline_traffic() (the engine owns the runner and may be gone when a command
// prints its report), and killing local workers when asked to (WorkerKiller).
// The model file and the shard source that sends workers without it their stages' tensors
// (dist/shard_source.h); outlives the pipeline runner that uses it.
struct WeightSource {
  WeightSource(gguf::GgufFile model_file, const std::string& model_hash)
      : file(std::move(model_file)), source(file, model_hash) {}
  gguf::GgufFile file;
  dist::ShardSource source;
};

class InstrumentedPipelineRunner final : public engine::StepRunner {
 public:
  InstrumentedPipelineRunner(std::shared_ptr<WeightSource> weights,
                             std::unique_ptr<dist::PipelineStepRunner> runner, WorkerKiller killer)
      : weights_(std::move(weights)),
        runner_(std::move(runner)),
        killer_(killer),
        random_(killer.seed) {
    record();
  }
  Result<ir::StepOutput> run(const ir::StepBatch& step) override {
    maybe_kill();
    Result<ir::StepOutput> output = runner_->run(step);
    record();
    return output;
  }
  // Copy-on-write copies of forked sequences (n > 1): queued by the pipeline, sent with the next
  // step.
  Status copy_blocks(std::span<const kv::BlockCopy> copies) override {
    return runner_->copy_blocks(copies);
  }
  int32_t vocab_size() const override { return runner_->vocab_size(); }
  int32_t max_logit_rows() const override { return runner_->max_logit_rows(); }
  Result<engine::RunnerRecovery> recover(const Status& failure) override {
    Result<engine::RunnerRecovery> recovery = runner_->recover(failure);
    record();
    return recovery;
  }
  Status replay(const ir::StepBatch& step, int32_t through_stage) override {
    Status replayed = runner_->replay(step, through_stage);
    record();
    return replayed;
  }
  bool available() const override { return runner_->available(); }

 private:
  void maybe_kill() {
    if (killer_.every <= 0 || killer_.rounds <= 0 || local_worker_group() == nullptr) return;
    if (++steps_ % killer_.every != 0) return;
    const std::vector<pid_t> pids = local_worker_group()->worker_pids();
    const pid_t victim = pids[random_.next() % pids.size()];
    if (victim > 0) kill(victim, SIGKILL);
    --killer_.rounds;
  }
  void record() {
    RecordedTraffic& recorded = recorded_traffic();
    const MutexLock lock(recorded.mutex);
    recorded.traffic = runner_->traffic();
  }
  std::shared_ptr<WeightSource> weights_;  // before runner_: destroyed after it
  std::unique_ptr<dist::PipelineStepRunner> runner_;
  WorkerKiller killer_;
  Xoshiro256StarStar random_;
  int64_t steps_ = 0;
};

// What the engine's remote runner is made from (the command's flags).
struct PipelineRunnerSettings {
  std::vector<std::string> addresses;
  // Workers that take a lost one's place, in order (--spare-workers); with --local-workers the
  // group's supervisor starts one instead.
  std::vector<std::string> spare_addresses;
  std::string model_path;
  model::LlamaShape shape;
  int64_t activation_bytes = 0;
  bool quiet = false;
  std::chrono::milliseconds lease_interval{100};
  int32_t lease_misses = 3;
  WorkerKiller killer;
  dist::Placement placement = dist::Placement::kPipeline;
  std::string collective_store;  // empty: the gRPC store of member 0's worker
  int32_t threads = 1;           // for measuring the memory bandwidth (--placement auto)
  int32_t kv_parallel = 1;       // --kv-parallel: members of a KV-parallel group, 1: none
};

// The cost model of --placement auto: this machine's memory read bandwidth, measured now, and
// the slowest of the workers' links as measured when they joined (half the empty Ping's median
// round trip as one message, the lowest bandwidth).
dist::PlacementCostModel measure_cost_model(const std::vector<dist::WorkerLink>& links,
                                            int32_t threads) {
  dist::PlacementCostModel cost;
  ThreadPool pool(std::max(1, threads));
  cost.memory_bytes_per_second =
      measure_read_bandwidth(pool, {.buffer_bytes = int64_t{256} << 20, .passes = 2});
  double slowest = 0;
  double bandwidth = 0;
  for (const dist::WorkerLink& link : links) {
    slowest = std::max(slowest, std::chrono::duration<double>(link.latency.median).count() / 2);
    if (link.bandwidth.bytes_per_second > 0) {
      bandwidth = bandwidth == 0 ? link.bandwidth.bytes_per_second
                                 : std::min(bandwidth, link.bandwidth.bytes_per_second);
    }
  }
  cost.link_latency_seconds = slowest;
  if (bandwidth > 0) cost.link_bytes_per_second = bandwidth;
  return cost;
}

// The engine's runner over tensor-parallel ranks on `clients` (rank r on clients[r]): each
// rank's pool holds its KV heads of the engine's KV blocks and the activation reserve.
Result<std::unique_ptr<engine::StepRunner>> tensor_parallel_runner(
    std::vector<std::unique_ptr<dist::WorkerClient>> clients, const dist::TensorParallelPlan& plan,
    const engine::RemoteStepSetup& setup, const PipelineRunnerSettings& settings,
    const std::string& model_hash) {
  dist::PipelineStageSpec spec = dist::pipeline_stage_spec(
      setup, 0, settings.shape.num_layers, plan.ranks.front().kv_bytes + settings.activation_bytes);
  // Empty: the members meet in the rendezvous store member 0's worker serves over gRPC.
  spec.collective_store = settings.collective_store;
  spec.collective_group_id = "folio-tp";
  FOLIO_ASSIGN_OR_RETURN(
      std::unique_ptr<dist::TensorParallelStepRunner> runner,
      dist::TensorParallelStepRunner::create(std::move(clients), spec, model_hash));
  return std::unique_ptr<engine::StepRunner>(
      std::make_unique<InstrumentedGroupRunner<dist::TensorParallelStepRunner>>(std::move(runner)));
}

// The engine's runner over a KV-parallel group on `clients` (member g on clients[g]): each
// member's pool holds the engine's KV block ids for its range (the whole model's KV per block)
// and the activation reserve.
Result<std::unique_ptr<engine::StepRunner>> kv_parallel_runner(
    std::vector<std::unique_ptr<dist::WorkerClient>> clients, const engine::RemoteStepSetup& setup,
    const PipelineRunnerSettings& settings, const std::string& model_hash) {
  if (setup.kv_parallel_members != static_cast<int32_t>(clients.size())) {
    return invalid_argument(
        "a KV-parallel group of {} members needs one worker per member, got {} workers: give "
        "--kv-parallel {} or as many workers",
        setup.kv_parallel_members, clients.size(), clients.size());
  }
  const int64_t kv_bytes =
      model::llama_stage_kv_cache_geometry(settings.shape, settings.shape.num_layers,
                                           setup.block_size, setup.kv_dtype, {})
          .block_bytes() *
      setup.num_kv_blocks;
  dist::PipelineStageSpec spec = dist::pipeline_stage_spec(setup, 0, settings.shape.num_layers,
                                                           kv_bytes + settings.activation_bytes);
  spec.kv_tokens_per_member = setup.kv_tokens_per_member;
  // Empty: the members meet in the rendezvous store member 0's worker serves over gRPC.
  spec.collective_store = settings.collective_store;
  spec.collective_group_id = "folio-kvp";
  if (!settings.quiet) {
    std::fprintf(stderr,
                 "KV-parallel group: %d members, %d positions of each sequence per member, %lld "
                 "KV blocks of %lld bytes each\n",
                 setup.kv_parallel_members, setup.kv_tokens_per_member,
                 static_cast<long long>(setup.num_kv_blocks),
                 static_cast<long long>(kv_bytes / std::max<int64_t>(1, setup.num_kv_blocks)));
  }
  FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<dist::KvParallelStepRunner> runner,
                         dist::KvParallelStepRunner::create(std::move(clients), spec, model_hash));
  return std::unique_ptr<engine::StepRunner>(
      std::make_unique<InstrumentedGroupRunner<dist::KvParallelStepRunner>>(std::move(runner)));
}

// Finds the worker that takes a lost one's place: a new local worker (--local-workers), else
// the next spare (--spare-workers), else the lost worker's own address (one restarted there).
dist::WorkerReplacer worker_replacer(std::vector<std::string> spare_addresses,
                                     dist::ModelIdentity identity, bool quiet) {
  auto spares =
      std::make_shared<std::deque<std::string>>(spare_addresses.begin(), spare_addresses.end());
  return [spares, identity = std::move(identity), quiet](
             int32_t stage,
             const std::string& lost_address) -> Result<std::unique_ptr<dist::WorkerClient>> {
    std::string address = lost_address;
    if (local_worker_group() != nullptr) {
      FOLIO_ASSIGN_OR_RETURN(address, local_worker_group()->replace(lost_address));
    } else if (!spares->empty()) {
      address = spares->front();
      spares->pop_front();
    }
    if (!quiet) {
      std::fprintf(
          stderr, "pipeline stage %d: worker %s lost; %s %s\n", stage, lost_address.c_str(),
          address == lost_address ? "reconnecting to" : "replacing it with", address.c_str());
    }
    return dist::WorkerClient::connect(address, identity);
  };
}

// The engine's remote runner over `addresses`: connects to each (handshake, model hash), plans
// the layer split by the IR's decode costs within each worker's declared memory, and prepares
// one stage per worker. Each stage's pool holds its layers' share of the engine's KV blocks
// and, for activations and captured graphs, half of this process's memory budget.
engine::RemoteRunnerFactory pipeline_runner_factory(PipelineRunnerSettings settings) {
  return [settings = std::move(settings)](
             const engine::RemoteStepSetup& setup) -> Result<std::unique_ptr<engine::StepRunner>> {
    FOLIO_ASSIGN_OR_RETURN(const dist::ModelIdentity identity, model_identity(settings.model_path));
    FOLIO_ASSIGN_OR_RETURN(const dist::PipelineModelCost cost,
                           dist::llama_pipeline_cost(settings.shape, setup.kv_dtype, 512));
    // The stages over `infos`, balanced by the IR's decode costs within each one's memory: at
    // start, and again over the survivors when a lost worker has no replacement.
    auto plan_stages = [cost, setup, activation_bytes = settings.activation_bytes,
                        quiet = settings.quiet](const std::vector<dist::WorkerInfo>& infos)
        -> Result<std::vector<dist::PipelineStageSpec>> {
      std::vector<dist::PipelineWorker> workers;
      for (const dist::WorkerInfo& info : infos) {
        const uint64_t memory = info.memory_budget_bytes;
        workers.push_back(
            {info.address,
             memory > 0 ? std::optional<int64_t>(static_cast<int64_t>(memory) - activation_bytes)
                        : std::nullopt});
      }
      const dist::PipelinePlanOptions plan_options{
          .balance = dist::PipelineBalance::kDecode,
          .kv_tokens = setup.num_kv_blocks * setup.block_size};
      FOLIO_ASSIGN_OR_RETURN(const dist::PipelinePlan plan,
                             dist::plan_pipeline(cost, workers, plan_options));
      if (!quiet) std::fputs(plan.to_string().c_str(), stderr);
      std::vector<dist::PipelineStageSpec> specs;
      for (const dist::PipelineStagePlan& stage : plan.stages) {
        specs.push_back(dist::pipeline_stage_spec(setup, stage.first_layer, stage.end_layer,
                                                  stage.kv_bytes + activation_bytes));
      }
      return specs;
    };
    std::vector<std::unique_ptr<dist::WorkerClient>> clients;
    std::vector<dist::WorkerInfo> infos;
    std::vector<dist::WorkerLink> links;
    for (const std::string& address : settings.addresses) {
      FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<dist::WorkerClient> client,
                             dist::WorkerClient::connect(address, identity));
      // The link as the activations will see it (gRPC included), measured at join.
      FOLIO_ASSIGN_OR_RETURN(const dist::WorkerLink link, client->measure_link());
      if (!settings.quiet) {
        std::fprintf(
            stderr, "worker %s: round trip %.0f us, %.0f MiB/s each way (%lld KiB Pings)\n",
            address.c_str(), std::chrono::duration<double, std::micro>(link.latency.median).count(),
            link.bandwidth.bytes_per_second / double(1 << 20),
            static_cast<long long>(dist::kLinkProbeBytes >> 10));
      }
      infos.push_back(client->info());
      clients.push_back(std::move(client));
      links.push_back(link);
    }
    if (settings.kv_parallel > 1 || setup.kv_parallel_members > 1) {
      if (setup.kv_parallel_members != settings.kv_parallel) {
        return failed_precondition(
            "--kv-parallel {}: the engine asks for a KV-parallel group of {}; the two must "
            "agree",
            settings.kv_parallel, setup.kv_parallel_members);
      }
      return kv_parallel_runner(std::move(clients), setup, settings, identity.hash);
    }
    if (settings.placement != dist::Placement::kPipeline) {
      std::vector<dist::PipelineWorker> workers;
      for (const dist::WorkerInfo& info : infos) {
        const uint64_t memory = info.memory_budget_bytes;
        workers.push_back({info.address, memory > 0
                                             ? std::optional<int64_t>(static_cast<int64_t>(memory) -
                                                                      settings.activation_bytes)
                                             : std::nullopt});
      }
      const Result<dist::TensorParallelPlan> tensor = dist::plan_tensor_parallel(
          settings.shape, workers,
          {.kv_dtype = setup.kv_dtype, .kv_tokens = setup.num_kv_blocks * setup.block_size});
      bool use_tensor = settings.placement == dist::Placement::kTensor;
      if (settings.placement == dist::Placement::kAuto) {
        const dist::PipelinePlanOptions plan_options{
            .balance = dist::PipelineBalance::kDecode,
            .kv_tokens = setup.num_kv_blocks * setup.block_size};
        const Result<dist::PipelinePlan> pipeline =
            dist::plan_pipeline(cost, workers, plan_options);
        const dist::PlacementCostModel cost_model = measure_cost_model(links, settings.threads);
        FOLIO_ASSIGN_OR_RETURN(const dist::PlacementChoice choice,
                               dist::choose_placement(pipeline, tensor, cost_model));
        use_tensor = choice.placement == dist::Placement::kTensor;
        if (!settings.quiet) {
          std::fprintf(stderr, "placement auto chose %s\n", choice.reason.c_str());
        }
      }
      if (use_tensor) {
        if (!tensor.ok()) return tensor.status().with_context("--placement tp");
        if (!settings.quiet) std::fputs(tensor->to_string().c_str(), stderr);
        return tensor_parallel_runner(std::move(clients), *tensor, setup, settings, identity.hash);
      }
    }
    FOLIO_ASSIGN_OR_RETURN(std::vector<dist::PipelineStageSpec> specs, plan_stages(infos));
    // The weight cache's source: workers without the model file are sent their stages' tensors
    // from this process's mapping of it.
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufFile weight_file, gguf::GgufFile::open(settings.model_path));
    auto weights = std::make_shared<WeightSource>(std::move(weight_file), identity.hash);
    if (setup.registry != nullptr)
      FOLIO_RETURN_IF_ERROR(weights->source.export_to(*setup.registry));
    dist::PipelineRecoveryOptions recovery;
    recovery.weight_source = &weights->source;
    recovery.lease_interval = settings.lease_interval;
    recovery.lease_misses = settings.lease_misses;
    recovery.replace_worker = worker_replacer(settings.spare_addresses, identity, settings.quiet);
    recovery.replan_on_survivors = plan_stages;
    recovery.registry = setup.registry;
    FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<dist::PipelineStepRunner> runner,
                           dist::PipelineStepRunner::create(std::move(clients), std::move(specs),
                                                            identity.hash, std::move(recovery)));
    return std::unique_ptr<engine::StepRunner>(std::make_unique<InstrumentedPipelineRunner>(
        std::move(weights), std::move(runner), settings.killer));
  };
}

}  // namespace

void add_engine_options(CLI::App& command, EngineCommandOptions& options) {
  command.add_option("-m,--model", options.model_path, "GGUF model file")->required();
  command
      .add_option("--workers", options.workers,
                  "Run the model on these `folio worker -m MODEL` addresses, HOST:PORT,... in "
                  "pipeline (or rank) order, split as --placement says")
      ->delimiter(',');
  command.add_option("--local-workers", options.local_workers,
                     "Run the model over this many `folio worker` processes started on free "
                     "loopback ports for this command, split as --placement says");
  command.add_option("--local-worker-threads", options.local_worker_threads,
                     "Compute threads of each local worker (0: --threads)");
  command.add_option("--local-worker-cache", options.local_worker_cache,
                     "Start the local workers without the model file, with this weight cache "
                     "directory: each is sent the tensors of its stage that the cache lacks");
  command
      .add_option("--spare-workers", options.spare_workers,
                  "Workers that take a lost worker's place, HOST:PORT,... in order (without: a "
                  "lost worker is waited for at its own address; --local-workers starts one)")
      ->delimiter(',');
  command
      .add_option("--lease-ms", options.lease_ms,
                  "Each worker's heartbeat interval, ms; a worker silent for --lease-misses of "
                  "them is lost")
      ->capture_default_str();
  command
      .add_option("--lease-misses", options.lease_misses,
                  "Heartbeats missed before a worker is lost")
      ->capture_default_str();
  command
      .add_option("--max-recoveries", options.max_recoveries,
                  "Recoveries from lost workers a request may go through; past them it ends "
                  "with an error")
      ->capture_default_str();
  command
      .add_option("--recovery", options.recovery,
                  "How the KV of a lost worker's stage is rebuilt: replay (the running sequences' "
                  "tokens through the stages up to the lost one only) or recompute (every "
                  "running sequence from its tokens, through every stage)")
      ->capture_default_str();
  command.add_option("--kill-local-worker-every", options.kill_local_worker_every,
                     "Fault injection: SIGKILL a random local worker every this many steps "
                     "(--kill-rounds times), to watch recovery work");
  command.add_option("--kill-rounds", options.kill_rounds, "Kills of --kill-local-worker-every")
      ->capture_default_str();
  command
      .add_option("--kill-seed", options.kill_seed, "Which workers --kill-local-worker-every picks")
      ->capture_default_str();
  command
      .add_option("--placement", options.placement,
                  "How --workers / --local-workers split the model: pp (layers, a pipeline), tp "
                  "(heads and FFN features: every worker runs every layer) or auto (the cheaper "
                  "decode token by the cost model, with links measured as workers join)")
      ->capture_default_str();
  command
      .add_option("--kv-parallel", options.kv_parallel,
                  "Spread each sequence's KV over this many workers by token range (a "
                  "KV-parallel group: every worker runs the whole model over its range, "
                  "attention merged exactly); needs as many --workers / --local-workers")
      ->capture_default_str();
  command.add_option("--kv-tokens-per-member", options.kv_tokens_per_member,
                     "Positions of each sequence a KV-parallel member holds, a multiple of "
                     "--block-size (0: the context split evenly)");
  command.add_option("--collective-store", options.collective_store,
                     "Tensor parallelism and KV-parallel groups: a directory every worker reaches, "
                     "where the ranks meet to form their gloo group (default: none; the ranks "
                     "meet in a store the first worker serves over gRPC, so they need no shared "
                     "file system)");
  command.add_option("--threads", options.threads, "Compute threads (0: all cores)");
  command
      .add_option("--memory-mib", options.memory_mib,
                  "Memory budget for KV cache and graph arena, MiB")
      ->capture_default_str();
  command.add_option("--kv-cache-mib", options.kv_cache_mib,
                     "Most of the budget the KV cache may hold, MiB (0: all the rest); with "
                     "--kv-parallel, each member's KV cache (0: half of --memory-mib)");
  command.add_option("--kv-dtype", options.kv_dtype, "KV cache element type: f16 or f32")
      ->capture_default_str();
  command.add_option("--block-size", options.block_size, "Tokens per KV block: 8, 16 or 32")
      ->capture_default_str();
  command.add_option("--max-seqs", options.max_sequences, "Most sequences running at once")
      ->capture_default_str();
  command.add_option("--max-batched-tokens", options.max_batched_tokens, "Tokens per step")
      ->capture_default_str();
  command.add_option("--chunk-size", options.chunk_size, "Prefill chunk size (tokens)")
      ->capture_default_str();
  command.add_option("--max-context", options.max_context, "Context limit (0: the model's)");
  command.add_flag("--no-graphs", options.no_graphs, "Run every step eagerly (no capture/replay)");
  command.add_option("--swap-mib", options.swap_mib,
                     "Host swap space for preemption by swap, MiB (0: recompute)");
  command
      .add_option("--kv-watermark", options.kv_watermark,
                  "Fraction of the KV cache that admitting a request must leave free, so running "
                  "sequences can grow without preempting at once")
      ->capture_default_str();
  command.add_flag("--no-pressure-handling", options.no_pressure_handling,
                   "Do not react to memory pressure (no eviction ahead of need, no admission "
                   "stop, no pressure preemption)");
  command.add_flag("--pressure-preempt-ahead", options.pressure_preempt_ahead,
                   "At the out-of-memory level, preempt one request per step before appends "
                   "fail (off: failed appends preempt, as always)");
  command
      .add_option("--pressure-warning", options.pressure_warning,
                  "Utilization ENTER:EXIT of the warning level: unused adapters, idle graph "
                  "captures and old cached prefixes are evicted down to EXIT; no prefetching")
      ->capture_default_str();
  command
      .add_option("--pressure-critical", options.pressure_critical,
                  "ENTER:EXIT of the critical level: no new request is admitted, prefill chunks "
                  "shrink, preemption takes the cheaper of recompute and swap")
      ->capture_default_str();
  command
      .add_option("--pressure-oom", options.pressure_out_of_memory,
                  "ENTER:EXIT of the out-of-memory level (a failed KV append also enters it): "
                  "failed appends preempt, and no new request is admitted")
      ->capture_default_str();
  command
      .add_option("--prefill-token-share", options.prefill_token_share,
                  "Share of a step's tokens prefill may take next to decodes, (0, 1]; lower "
                  "keeps decodes' time per token down at the cost of time to first token (1: "
                  "no cap; the phase tuner's starting point)")
      ->capture_default_str();
  command
      .add_option("--decode-kv-share", options.decode_kv_share,
                  "Share of the KV cache admission keeps free for running sequences to grow, "
                  "[0, 1) (0: none; the phase tuner's starting point)")
      ->capture_default_str();
  command.add_flag("--phase-tuner", options.phase_tuner,
                   "Let the phase tuner move both shares toward the TTFT and TPOT targets "
                   "(off by default: the shares stay as given)");
  command
      .add_option("--phase-tuner-rate", options.phase_tuner_rate,
                  "Largest move of a share per 8-step window")
      ->capture_default_str();
  command
      .add_option("--phase-tuner-min-prefill-share", options.phase_tuner_min_prefill_share,
                  "Lowest prefill token share the tuner may set")
      ->capture_default_str();
  command
      .add_option("--phase-tuner-max-decode-kv-share", options.phase_tuner_max_decode_kv_share,
                  "Highest decode KV share the tuner may set")
      ->capture_default_str();
  command
      .add_option("--phase-tuner-ttft-ms", options.phase_tuner_ttft_ms,
                  "Queue wait the tuner steers below (a TTFT target), ms")
      ->capture_default_str();
  command
      .add_option("--phase-tuner-tpot-ms", options.phase_tuner_tpot_ms,
                  "Decode step time the tuner steers below (a TPOT target), ms")
      ->capture_default_str();
  command
      .add_option("--preemption", options.preemption,
                  "How a preempted sequence gives up its KV: recompute, swap, cheaper (per "
                  "victim, by measured cost), or auto (swap with --swap-mib, else recompute)")
      ->capture_default_str();
  command.add_flag("-q,--quiet", options.quiet, "No progress messages");
  command.add_option("--lora", options.loras,
                     "LoRA adapter NAME=PATH[:SCALE] (llama.cpp adapter GGUF); repeatable");
  command.add_option("--lora-dir", options.lora_dir,
                     "Register every .gguf adapter in this directory, named by file stem");
  command.add_option("--lora-hot-mib", options.lora_hot_mib,
                     "Most of the pool hot adapters may hold, MiB (0: no cap)");
  command
      .add_option("--lora-warm-mib", options.lora_warm_mib,
                  "Host memory for warm (int8) adapters, MiB")
      ->capture_default_str();
}

Result<AdapterSpec> parse_adapter_spec(const std::string& text) {
  const size_t equals = text.find('=');
  if (equals == std::string::npos || equals == 0 || equals + 1 == text.size()) {
    return invalid_argument("--lora '{}': expected NAME=PATH[:SCALE]", text);
  }
  AdapterSpec spec;
  spec.name = text.substr(0, equals);
  spec.path = text.substr(equals + 1);
  const size_t colon = spec.path.rfind(':');
  if (colon != std::string::npos) {
    const std::string scale = spec.path.substr(colon + 1);
    char* end = nullptr;
    const float value = std::strtof(scale.c_str(), &end);
    if (!scale.empty() && end == scale.c_str() + scale.size()) {
      spec.scale = value;
      spec.path.resize(colon);
    }
  }
  return spec;
}

Result<memory::PressureBand> parse_pressure_band(const std::string& text, std::string_view flag) {
  const size_t colon = text.find(':');
  char* end = nullptr;
  memory::PressureBand band;
  if (colon != std::string::npos) {
    const std::string enter = text.substr(0, colon);
    const std::string exit = text.substr(colon + 1);
    band.enter = std::strtod(enter.c_str(), &end);
    const bool enter_ok = !enter.empty() && end == enter.c_str() + enter.size();
    band.exit = std::strtod(exit.c_str(), &end);
    const bool exit_ok = !exit.empty() && end == exit.c_str() + exit.size();
    if (enter_ok && exit_ok) return band;
  }
  return invalid_argument("{} '{}': expected ENTER:EXIT, two fractions such as 0.80:0.75", flag,
                          text);
}

namespace {

Status register_adapters(const EngineCommandOptions& options, lora::AdapterManager& adapters) {
  std::vector<AdapterSpec> specs;
  for (const std::string& text : options.loras) {
    FOLIO_ASSIGN_OR_RETURN(AdapterSpec spec, parse_adapter_spec(text));
    specs.push_back(std::move(spec));
  }
  if (!options.lora_dir.empty()) {
    std::error_code error;
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(options.lora_dir, error)) {
      if (entry.is_regular_file() && entry.path().extension() == ".gguf") {
        files.push_back(entry.path());
      }
    }
    if (error) {
      return invalid_argument("--lora-dir {}: {}", options.lora_dir, error.message());
    }
    std::sort(files.begin(), files.end());
    for (const std::filesystem::path& file : files) {
      specs.push_back(AdapterSpec{file.stem().string(), file.string(), 1.0f});
    }
  }
  for (const AdapterSpec& spec : specs) {
    Result<lora::AdapterInfo> info = adapters.register_adapter(spec.name, spec.path, spec.scale);
    if (!info.ok()) return info.status().with_context(fmt::format("adapter '{}'", spec.name));
    if (!options.quiet) {
      std::fprintf(stderr, "adapter %s: %s, rank %lld, %d projections, %.1f KiB hot\n",
                   spec.name.c_str(), spec.path.c_str(), static_cast<long long>(info->max_rank),
                   info->num_targets, static_cast<double>(info->hot_bytes) / 1024.0);
    }
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<engine::ModelEngine>> start_model_engine(
    const EngineCommandOptions& options,
    const std::function<void(engine::ModelEngineOptions&)>& customize) {
  const auto start = std::chrono::steady_clock::now();
  if (!options.quiet) std::fprintf(stderr, "loading %s ...\n", options.model_path.c_str());
  FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> model,
                         model::LlamaModel::open(options.model_path));
  {
    ProgressBar bar("loading weights", model->weight_bytes(), ProgressUnit::kBytes, "",
                    !options.quiet);
    model->prefault_weights([&bar](int64_t done, int64_t) { bar.update(done); });
  }
  if (options.kv_cache_mib < 0) {
    return invalid_argument("--kv-cache-mib must be 0 (no cap) or positive, got {}",
                            options.kv_cache_mib);
  }
  engine::ModelEngineOptions engine_options;
  if (options.threads > 0) engine_options.num_threads = options.threads;
  engine_options.memory_budget_bytes = options.memory_mib << 20;
  engine_options.kv_cache_bytes = options.kv_cache_mib << 20;
  std::optional<DType> kv_dtype = dtype_from_name(options.kv_dtype);
  if (!kv_dtype || (*kv_dtype != DType::kF16 && *kv_dtype != DType::kF32)) {
    return invalid_argument("--kv-dtype must be f16 or f32, got '{}'", options.kv_dtype);
  }
  engine_options.kv_dtype = *kv_dtype;
  engine_options.block_size = options.block_size;
  engine_options.max_context_tokens = options.max_context;
  engine_options.use_graphs = !options.no_graphs;
  engine_options.swap_bytes = options.swap_mib << 20;
  engine_options.kv_watermark = options.kv_watermark;
  engine_options.pressure.enabled = !options.no_pressure_handling;
  engine_options.pressure.preempt_ahead = options.pressure_preempt_ahead;
  FOLIO_ASSIGN_OR_RETURN(engine_options.pressure.thresholds.warning,
                         parse_pressure_band(options.pressure_warning, "--pressure-warning"));
  FOLIO_ASSIGN_OR_RETURN(engine_options.pressure.thresholds.critical,
                         parse_pressure_band(options.pressure_critical, "--pressure-critical"));
  FOLIO_ASSIGN_OR_RETURN(engine_options.pressure.thresholds.out_of_memory,
                         parse_pressure_band(options.pressure_out_of_memory, "--pressure-oom"));
  FOLIO_RETURN_IF_ERROR(engine_options.pressure.thresholds.validate());
  engine_options.scheduler.max_num_sequences = options.max_sequences;
  engine_options.scheduler.max_num_batched_tokens = options.max_batched_tokens;
  engine_options.scheduler.prefill_chunk_size = options.chunk_size;
  engine_options.scheduler.phase_split = {options.prefill_token_share, options.decode_kv_share};
  engine::PhaseBudgetTunerOptions& tuner = engine_options.phase_tuner;
  tuner.enabled = options.phase_tuner;
  tuner.learning_rate = options.phase_tuner_rate;
  tuner.min_prefill_token_share = options.phase_tuner_min_prefill_share;
  tuner.max_decode_kv_share = options.phase_tuner_max_decode_kv_share;
  tuner.ttft_target = std::chrono::duration_cast<engine::Duration>(
      std::chrono::duration<double, std::milli>(options.phase_tuner_ttft_ms));
  tuner.tpot_target = std::chrono::duration_cast<engine::Duration>(
      std::chrono::duration<double, std::milli>(options.phase_tuner_tpot_ms));
  if (options.preemption == "auto") {
    if (options.swap_mib > 0) {
      engine_options.scheduler.preemption_mode = engine::PreemptionMode::kSwap;
    }
  } else if (options.preemption == "recompute") {
    engine_options.scheduler.preemption_mode = engine::PreemptionMode::kRecompute;
  } else if (options.preemption == "swap" || options.preemption == "cheaper") {
    if (options.swap_mib <= 0) {
      return invalid_argument("--preemption {} needs host swap space: give --swap-mib",
                              options.preemption);
    }
    engine_options.scheduler.preemption_mode = options.preemption == "swap"
                                                   ? engine::PreemptionMode::kSwap
                                                   : engine::PreemptionMode::kCheaper;
  } else {
    return invalid_argument("--preemption must be auto, recompute, swap or cheaper, got '{}'",
                            options.preemption);
  }
  if (options.max_recoveries < 0) {
    return invalid_argument("--max-recoveries must not be negative, got {}",
                            options.max_recoveries);
  }
  engine_options.max_recoveries_per_request = options.max_recoveries;
  if (options.recovery != "replay" && options.recovery != "recompute") {
    return invalid_argument("--recovery must be replay or recompute, got '{}'", options.recovery);
  }
  engine_options.replay_lost_stages = options.recovery == "replay";
  engine_options.adapters = options.adapters || !options.loras.empty() || !options.lora_dir.empty();
  if (options.lora_hot_mib < 0 || options.lora_warm_mib < 0) {
    return invalid_argument("--lora-hot-mib and --lora-warm-mib must not be negative");
  }
  engine_options.adapter_options.hot_budget_bytes = options.lora_hot_mib << 20;
  engine_options.adapter_options.warm_budget_bytes = options.lora_warm_mib << 20;
  if (!options.quiet && !options.no_graphs) {
    std::fprintf(stderr, "capturing decode graphs ...\n");
  }
  if (!options.workers.empty() && options.local_workers > 0) {
    return invalid_argument("give --workers or --local-workers, not both");
  }
  // Checked before any local worker starts.
  const int32_t worker_count = options.local_workers > 0
                                   ? options.local_workers
                                   : static_cast<int32_t>(options.workers.size());
  if (options.kv_parallel < 1 || options.kv_tokens_per_member < 0) {
    return invalid_argument(
        "--kv-parallel must be at least 1 and --kv-tokens-per-member not "
        "negative, got {} and {}",
        options.kv_parallel, options.kv_tokens_per_member);
  }
  if (options.kv_parallel > 1) {
    if (worker_count == 0) {
      return invalid_argument(
          "--kv-parallel {} spreads the KV over workers: give --workers or --local-workers {}",
          options.kv_parallel, options.kv_parallel);
    }
    if (worker_count != options.kv_parallel) {
      return invalid_argument(
          "--kv-parallel {} needs one worker per member, got {} (KV-parallel groups and "
          "pipeline stages do not combine yet)",
          options.kv_parallel, worker_count);
    }
    if (options.placement != "pp") {
      return invalid_argument(
          "--kv-parallel with --placement {}: every member runs the whole model; KV-parallel "
          "groups and tensor splits do not combine yet",
          options.placement);
    }
    if (!options.spare_workers.empty() || options.kill_local_worker_every > 0) {
      return invalid_argument(
          "--kv-parallel: recovery from lost workers (--spare-workers, "
          "--kill-local-worker-every) is for pipelines only");
    }
    if (options.kv_tokens_per_member % options.block_size != 0) {
      return invalid_argument(
          "--kv-tokens-per-member {} is not a multiple of --block-size {}: a member holds "
          "whole blocks",
          options.kv_tokens_per_member, options.block_size);
    }
    engine_options.kv_parallel_members = options.kv_parallel;
    engine_options.kv_tokens_per_member = options.kv_tokens_per_member;
    // Each member's KV cache lives on its worker, beside the activation reserve (half the
    // budget, kv_parallel_runner): without --kv-cache-mib it takes the other half.
    if (engine_options.kv_cache_bytes == 0) {
      engine_options.kv_cache_bytes = engine_options.memory_budget_bytes / 2;
    }
  } else if (options.kv_tokens_per_member > 0) {
    return invalid_argument("--kv-tokens-per-member needs --kv-parallel N (N > 1)");
  }
  std::vector<std::string> worker_addresses = options.workers;
  if (options.local_workers > 0) {
    const int32_t threads =
        options.local_worker_threads > 0 ? options.local_worker_threads : options.threads;
    FOLIO_ASSIGN_OR_RETURN(local_worker_group(),
                           LocalWorkers::start(options.local_workers, options.model_path, threads,
                                               0, options.local_worker_cache));
    worker_addresses = local_worker_group()->addresses();
    if (!options.quiet) {
      std::fprintf(stderr, "started %d local workers\n", options.local_workers);
    }
  }
  if (!worker_addresses.empty()) {
    PipelineRunnerSettings settings;
    settings.kv_parallel = options.kv_parallel;
    settings.addresses = worker_addresses;
    settings.spare_addresses = options.spare_workers;
    settings.model_path = options.model_path;
    settings.shape = model->shape();
    settings.activation_bytes = engine_options.memory_budget_bytes / 2;
    settings.quiet = options.quiet;
    settings.lease_interval = std::chrono::milliseconds(options.lease_ms);
    settings.lease_misses = options.lease_misses;
    settings.killer = {.every = options.kill_local_worker_every,
                       .rounds = options.kill_rounds,
                       .seed = options.kill_seed};
    FOLIO_ASSIGN_OR_RETURN(settings.placement, dist::parse_placement(options.placement));
    settings.collective_store = options.collective_store;
    settings.threads = options.threads > 0 ? options.threads : ThreadPool::default_num_threads();
    if (settings.placement != dist::Placement::kPipeline &&
        (settings.killer.every > 0 || !settings.spare_addresses.empty())) {
      return invalid_argument(
          "--placement {}: recovery from lost workers (--spare-workers, "
          "--kill-local-worker-every) is for pipelines only",
          options.placement);
    }
    engine_options.remote_runner = pipeline_runner_factory(std::move(settings));
  } else if (options.placement != "pp") {
    return invalid_argument(
        "--placement {} splits the model over workers: give --workers or "
        "--local-workers",
        options.placement);
  } else if (!options.spare_workers.empty() || options.kill_local_worker_every > 0) {
    return invalid_argument(
        "--spare-workers and --kill-local-worker-every need a pipeline: give --workers or "
        "--local-workers");
  }
  if (options.kill_local_worker_every > 0 && options.local_workers == 0) {
    return invalid_argument("--kill-local-worker-every kills local workers: give --local-workers");
  }
  if (options.lease_ms < 1 || options.lease_misses < 1) {
    return invalid_argument("--lease-ms and --lease-misses must be at least 1, got {} and {}",
                            options.lease_ms, options.lease_misses);
  }
  if (customize) customize(engine_options);
  Result<std::unique_ptr<engine::ModelEngine>> bundle =
      engine::ModelEngine::create(std::move(model), engine_options);
  if (!bundle.ok()) return bundle.status().with_context(options.model_path);
  if ((*bundle)->adapters() != nullptr) {
    FOLIO_RETURN_IF_ERROR(register_adapters(options, *(*bundle)->adapters()));
  }
  if (!options.quiet) {
    const model::LlamaShape& shape = (*bundle)->model().shape();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(
        stderr,
        "loaded %s: %s, %lld layers, hidden %lld, vocab %lld, %s weights, %d threads, "
        "%lld MiB pool (%.2f s)\n",
        options.model_path.c_str(),
        std::string(model::llama_architecture_name(shape.architecture)).c_str(),
        static_cast<long long>(shape.num_layers), static_cast<long long>(shape.hidden_size),
        static_cast<long long>(shape.vocab_size),
        std::string(dtype_name(shape.weight_dtype)).c_str(), (*bundle)->thread_pool().num_threads(),
        static_cast<long long>(options.memory_mib), seconds);
  }
  return bundle;
}

std::optional<dist::PipelineTraffic> pipeline_traffic() {
  RecordedTraffic& recorded = recorded_traffic();
  const MutexLock lock(recorded.mutex);
  return recorded.traffic;
}

std::optional<dist::TensorParallelTraffic> tensor_parallel_traffic() {
  auto& recorded = recorded_group_traffic<dist::TensorParallelTraffic>();
  const MutexLock lock(recorded.mutex);
  return recorded.traffic;
}

std::optional<dist::KvParallelTraffic> kv_parallel_traffic() {
  auto& recorded = recorded_group_traffic<dist::KvParallelTraffic>();
  const MutexLock lock(recorded.mutex);
  return recorded.traffic;
}

Result<int64_t> resolve_adapter(engine::ModelEngine& model_engine, const std::string& name) {
  lora::AdapterManager* adapters = model_engine.adapters();
  if (name == "base" || (name.empty() && adapters == nullptr)) return int64_t{0};
  if (adapters == nullptr) {
    return invalid_argument("--adapter {} needs adapters: register them with --lora", name);
  }
  const std::vector<lora::AdapterInfo> registered = adapters->list();
  if (name.empty()) return registered.size() == 1 ? registered[0].id : int64_t{0};
  if (std::optional<lora::AdapterInfo> info = adapters->find(name)) return info->id;
  std::string names;
  for (const lora::AdapterInfo& info : registered) names += (names.empty() ? "" : ", ") + info.name;
  return not_found("no adapter named '{}'; registered: {}", name, names.empty() ? "none" : names);
}

}  // namespace folio::app

// Command-line options shared by the commands that start a model engine (generate, bench,
// serve), and the function that starts one from them.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "folio/dist/kv_parallel_step_runner.h"
#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/tensor_parallel_step_runner.h"
#include "folio/engine/model_engine.h"

namespace folio::app {

struct EngineCommandOptions {
  std::string model_path;
  int threads = 0;  // 0: FOLIO_NUM_THREADS or the hardware's
  int64_t memory_mib = 512;
  int64_t kv_cache_mib = 0;  // 0: no cap within the pool
  std::string kv_dtype = "f16";
  int32_t block_size = 16;
  int32_t max_sequences = 64;
  int32_t max_batched_tokens = 2048;
  int32_t chunk_size = 512;
  int32_t max_context = 0;
  bool no_graphs = false;
  int64_t swap_mib = 0;
  double kv_watermark = 0.01;
  // Memory pressure (engine/memory_pressure_handler.h): ENTER:EXIT utilization fractions.
  bool no_pressure_handling = false;
  bool pressure_preempt_ahead = false;
  std::string pressure_warning = "0.80:0.75";
  std::string pressure_critical = "0.95:0.90";
  std::string pressure_out_of_memory = "0.99:0.97";
  // Phase split and its tuner (scheduler.h PhaseSplit, phase_budget_tuner.h).
  double prefill_token_share = 1.0;
  double decode_kv_share = 0.0;
  bool phase_tuner = false;
  double phase_tuner_rate = 0.1;
  double phase_tuner_min_prefill_share = 0.125;
  double phase_tuner_max_decode_kv_share = 0.25;
  double phase_tuner_ttft_ms = 1000;
  double phase_tuner_tpot_ms = 50;
  std::string preemption = "auto";  // auto (swap with --swap-mib, else recompute), or a mode
  bool quiet = false;
  // LoRA adapters: NAME=PATH[:SCALE] each, and every *.gguf of a directory (named by its file
  // stem). Any of them, or `adapters` set by a command, starts the engine with adapters.
  std::vector<std::string> loras;
  std::string lora_dir;
  bool adapters = false;
  int64_t lora_hot_mib = 0;  // 0: as much of the pool as it gives
  int64_t lora_warm_mib = 256;
  // Pipeline parallelism (issue 15): run the model's layers on these `folio worker` addresses
  // (HOST:PORT, in pipeline order), or on this many local worker processes started for the
  // command and stopped at its end. Empty / 0: this process runs every layer.
  std::vector<std::string> workers;
  int32_t local_workers = 0;
  int32_t local_worker_threads = 0;  // 0: --threads
  // Start the local workers without the model file, with this weight cache (issue 15 slice 5):
  // each is sent its stage's tensors its cache lacks. Empty: they open the model file.
  std::string local_worker_cache;
  // Recovery from a lost worker (issue 16): the workers that take its place, the heartbeat
  // lease, each request's limit, and fault injection to try it.
  std::vector<std::string> spare_workers;
  int32_t lease_ms = 100;
  int32_t lease_misses = 3;
  int32_t max_recoveries = 3;
  std::string recovery = "replay";      // or "recompute": EngineOptions::replay_lost_stages
  int32_t kill_local_worker_every = 0;  // 0: never
  int32_t kill_rounds = 1;
  uint64_t kill_seed = 1;
  // How the workers split the model (issue 15, slice 4): "pp" (layers, a pipeline), "tp"
  // (heads and FFN features, every worker every layer) or "auto" (the cost model's cheaper
  // decode token, from each worker's Ping latency measured when it joins). Tensor ranks form a
  // gloo group through the directory collective_store (empty: through the rendezvous store the
  // first worker serves over gRPC, no shared file system needed).
  std::string placement = "pp";
  std::string collective_store;
  // A KV-parallel group (issue 15, slice 6): each sequence's KV spread over kv_parallel workers
  // by token range (1: none), kv_tokens_per_member positions each (0: the context split evenly).
  int32_t kv_parallel = 1;
  int32_t kv_tokens_per_member = 0;
};

struct AdapterSpec {
  std::string name;
  std::string path;
  float scale = 1.0f;
};
// Parses NAME=PATH[:SCALE]. kInvalidArgument naming the flag's text when malformed.
Result<AdapterSpec> parse_adapter_spec(const std::string& text);

// Parses a pressure level's ENTER:EXIT flag. kInvalidArgument naming the flag when malformed.
Result<memory::PressureBand> parse_pressure_band(const std::string& text, std::string_view flag);

// Registers the options on `command`; -m/--model is required.
void add_engine_options(CLI::App& command, EngineCommandOptions& options);

// Opens the model and starts its engine (not yet its loop thread). Prints loading progress to
// stderr unless quiet. `customize`, when given, adjusts the engine options made from the flags
// before the engine is created (a command's own needs, e.g. perplexity's logit rows per step).
Result<std::unique_ptr<engine::ModelEngine>> start_model_engine(
    const EngineCommandOptions& options,
    const std::function<void(engine::ModelEngineOptions&)>& customize = nullptr);

// What crossed the wire between this process and its pipeline workers so far (serialized gRPC
// messages), when the engine started with --workers or --local-workers; nullopt otherwise.
std::optional<dist::PipelineTraffic> pipeline_traffic();

// What the tensor-parallel ranks cost so far (the coordinator's gRPC bytes, and the ranks'
// collectives as rank 0 saw them), when the engine started with --placement tp (or auto chose
// it); nullopt otherwise.
std::optional<dist::TensorParallelTraffic> tensor_parallel_traffic();
// The same for a KV-parallel group's runner (--kv-parallel).
std::optional<dist::KvParallelTraffic> kv_parallel_traffic();

// The adapter a command runs with: `name` ("base" for none); empty: the only registered
// adapter when exactly one is, else the base model. kNotFound naming the registered ones.
Result<int64_t> resolve_adapter(engine::ModelEngine& model_engine, const std::string& name);

}  // namespace folio::app

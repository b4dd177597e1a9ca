#include "apps/folio/engine_options.h"

#include <chrono>
#include <cstdio>

namespace folio::app {

void add_engine_options(CLI::App& command, EngineCommandOptions& options) {
  command.add_option("-m,--model", options.model_path, "GGUF model file")->required();
  command.add_option("--threads", options.threads, "Compute threads (0: all cores)");
  command
      .add_option("--memory-mib", options.memory_mib,
                  "Memory budget for KV cache and graph arena, MiB")
      ->capture_default_str();
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
  command.add_flag("-q,--quiet", options.quiet, "No progress messages");
}

Result<std::unique_ptr<engine::ModelEngine>> start_model_engine(
    const EngineCommandOptions& options,
    const std::function<void(engine::ModelEngineOptions&)>& customize) {
  const auto start = std::chrono::steady_clock::now();
  if (!options.quiet) std::fprintf(stderr, "loading %s ...\n", options.model_path.c_str());
  FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> model,
                         model::LlamaModel::open(options.model_path));
  engine::ModelEngineOptions engine_options;
  if (options.threads > 0) engine_options.num_threads = options.threads;
  engine_options.memory_budget_bytes = options.memory_mib << 20;
  std::optional<DType> kv_dtype = dtype_from_name(options.kv_dtype);
  if (!kv_dtype || (*kv_dtype != DType::kF16 && *kv_dtype != DType::kF32)) {
    return invalid_argument("--kv-dtype must be f16 or f32, got '{}'", options.kv_dtype);
  }
  engine_options.kv_dtype = *kv_dtype;
  engine_options.block_size = options.block_size;
  engine_options.max_context_tokens = options.max_context;
  engine_options.use_graphs = !options.no_graphs;
  engine_options.swap_bytes = options.swap_mib << 20;
  engine_options.scheduler.max_num_sequences = options.max_sequences;
  engine_options.scheduler.max_num_batched_tokens = options.max_batched_tokens;
  engine_options.scheduler.prefill_chunk_size = options.chunk_size;
  if (options.swap_mib > 0)
    engine_options.scheduler.preemption_mode = engine::PreemptionMode::kSwap;
  if (customize) customize(engine_options);
  Result<std::unique_ptr<engine::ModelEngine>> bundle =
      engine::ModelEngine::create(std::move(model), engine_options);
  if (!bundle.ok()) return bundle.status().with_context(options.model_path);
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

}  // namespace folio::app

// Command-line options shared by the commands that start a model engine (generate, bench,
// serve), and the function that starts one from them.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "folio/engine/model_engine.h"

namespace folio::app {

struct EngineCommandOptions {
  std::string model_path;
  int threads = 0;  // 0: FOLIO_NUM_THREADS or the hardware's
  int64_t memory_mib = 512;
  std::string kv_dtype = "f16";
  int32_t block_size = 16;
  int32_t max_sequences = 64;
  int32_t max_batched_tokens = 2048;
  int32_t chunk_size = 512;
  int32_t max_context = 0;
  bool no_graphs = false;
  int64_t swap_mib = 0;
  bool quiet = false;
};

// Registers the options on `command`; -m/--model is required.
void add_engine_options(CLI::App& command, EngineCommandOptions& options);

// Opens the model and starts its engine (not yet its loop thread). Prints loading progress to
// stderr unless quiet. `customize`, when given, adjusts the engine options made from the flags
// before the engine is created (a command's own needs, e.g. perplexity's logit rows per step).
Result<std::unique_ptr<engine::ModelEngine>> start_model_engine(
    const EngineCommandOptions& options,
    const std::function<void(engine::ModelEngineOptions&)>& customize = nullptr);

}  // namespace folio::app

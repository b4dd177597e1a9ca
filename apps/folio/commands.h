// The subcommands of the `folio` program. Each add_*_command registers its options on the app
// and a callback that runs it; a callback that fails throws CommandFailure, which main() turns
// into a message and a non-zero exit, so every command reports errors the same way.
#pragma once

#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "folio/base/status.h"

namespace folio::app {

struct CommandFailure : std::runtime_error {
  explicit CommandFailure(const Status& status) : std::runtime_error(status.to_string()) {}
};

// Throws CommandFailure when `status` is an error.
inline void check_command(const Status& status) {
  if (!status.ok()) throw CommandFailure(status);
}

void add_make_model_command(CLI::App& app);
void add_make_adapter_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_worker_command(CLI::App& app);
void add_workers_check_command(CLI::App& app);
void add_plan_command(CLI::App& app);

}  // namespace folio::app

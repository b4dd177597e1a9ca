// folio: the command-line program. It only wires layers together; each subcommand lives in its
// own file (commands.h).
#include <cstdio>

#include <CLI/CLI.hpp>

#include "apps/folio/commands.h"
#include "folio/base/log.h"

int main(int argc, char** argv) {
  folio::log::init_from_environment();
  CLI::App app{"Folio: an LLM inference engine (memory and execution runtime)", "folio"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "folio 0.1.0");
  folio::app::add_make_model_command(app);
  folio::app::add_make_adapter_command(app);
  folio::app::add_quantize_command(app);
  folio::app::add_inspect_command(app);
  folio::app::add_generate_command(app);
  folio::app::add_bench_command(app);
  folio::app::add_perplexity_command(app);
  folio::app::add_serve_command(app);
  folio::app::add_worker_command(app);
  folio::app::add_workers_check_command(app);
  folio::app::add_plan_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const folio::app::CommandFailure& failure) {
    std::fprintf(stderr, "folio: %s\n", failure.what());
    return 1;
  }
  return 0;
}

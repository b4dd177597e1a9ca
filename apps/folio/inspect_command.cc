// folio inspect: prints a GGUF file's header, metadata, tensor table and totals.
#include <cstdio>
#include <string>

#include "apps/folio/commands.h"
#include "folio/gguf/gguf_file.h"
#include "folio/gguf/gguf_inspect.h"

namespace folio::app {

void add_inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto summary_only = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand("inspect", "Print a GGUF file's metadata and tensors");
  command->add_option("file", *path, "GGUF file")->required();
  command->add_flag("--summary", *summary_only, "Header, metadata and totals only");
  command->callback([path, summary_only] {
    Result<gguf::GgufFile> file = gguf::GgufFile::open(*path);
    check_command(file.status());
    gguf::InspectOptions options;
    options.show_tensors = !*summary_only;
    std::fputs(gguf::render_gguf_summary(*file, options).c_str(), stdout);
  });
}

}  // namespace folio::app

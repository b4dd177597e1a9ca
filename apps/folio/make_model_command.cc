// folio make-model: writes a deterministic random-weight Llama-family GGUF of any shape, so
// tests, benchmarks and the demo need no download.
#include <cstdio>
#include <map>
#include <string>

#include "apps/folio/commands.h"
#include "folio/model/gguf_inspect.h"
#include "folio/model/llama_model_file.h"

namespace folio::app {
namespace {

// Named shapes: "tiny" and "base" are the benchmark shapes of the models issue.
const std::map<std::string, model::LlamaShape>& named_shapes() {
  static const std::map<std::string, model::LlamaShape> shapes = [] {
    std::map<std::string, model::LlamaShape> result;
    model::LlamaShape small;  // the defaults: a fast model for tests
    result["small"] = small;
    model::LlamaShape tiny;
    tiny.vocab_size = 32000;
    tiny.hidden_size = 288;
    tiny.num_layers = 6;
    tiny.num_heads = 6;
    tiny.num_kv_heads = 6;
    tiny.ffn_size = 768;
    tiny.context_length = 256;
    result["tiny"] = tiny;
    model::LlamaShape base;
    base.vocab_size = 32000;
    base.hidden_size = 768;
    base.num_layers = 12;
    base.num_heads = 12;
    base.num_kv_heads = 4;
    base.ffn_size = 2048;
    base.context_length = 2048;
    result["base"] = base;
    return result;
  }();
  return shapes;
}

struct MakeModelOptions {
  std::string output;
  std::string preset = "small";
  std::string dtype = "f32";
  std::string architecture = "llama";
  uint64_t seed = 1;
  bool tie_embeddings = false;
  // Overrides of the preset; 0 (or a non-positive float) keeps the preset's value.
  int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, ffn = 0, context = 0;
  double rope_theta = 0;
};

Result<model::LlamaShape> shape_from(const MakeModelOptions& options) {
  auto preset = named_shapes().find(options.preset);
  if (preset == named_shapes().end()) {
    return invalid_argument("unknown preset '{}': use small, tiny or base", options.preset);
  }
  model::LlamaShape shape = preset->second;
  auto architecture = model::llama_architecture_from_name(options.architecture);
  if (!architecture) {
    return invalid_argument("unknown architecture '{}': use llama or qwen2", options.architecture);
  }
  shape.architecture = *architecture;
  std::optional<DType> dtype = dtype_from_name(options.dtype);
  if (!dtype)
    return invalid_argument("unknown dtype '{}': use f32, f16, bf16, q8_0 or q4_0", options.dtype);
  shape.weight_dtype = *dtype;
  shape.tie_embeddings = options.tie_embeddings;
  auto override_with = [](int64_t value, int64_t& field) {
    if (value > 0) field = value;
  };
  override_with(options.vocab, shape.vocab_size);
  override_with(options.hidden, shape.hidden_size);
  override_with(options.layers, shape.num_layers);
  override_with(options.heads, shape.num_heads);
  override_with(options.kv_heads, shape.num_kv_heads);
  override_with(options.ffn, shape.ffn_size);
  override_with(options.context, shape.context_length);
  if (options.rope_theta > 0) shape.rope_theta = static_cast<float>(options.rope_theta);
  FOLIO_RETURN_IF_ERROR(model::validate_llama_shape(shape));
  return shape;
}

}  // namespace

void add_make_model_command(CLI::App& app) {
  auto options = std::make_shared<MakeModelOptions>();
  CLI::App* command = app.add_subcommand(
      "make-model", "Write a deterministic random-weight Llama-family GGUF model");
  command->add_option("-o,--output", options->output, "Path of the GGUF file to write")->required();
  command->add_option("--preset", options->preset, "Base shape: small, tiny or base")
      ->capture_default_str();
  command->add_option("--dtype", options->dtype, "Weight type: f32, f16, bf16, q8_0, q4_0")
      ->capture_default_str();
  command->add_option("--arch", options->architecture, "Architecture: llama or qwen2")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "Random seed (same seed, same bytes)")
      ->capture_default_str();
  command->add_flag("--tie-embeddings", options->tie_embeddings,
                    "Reuse the token embedding as the output matrix");
  command->add_option("--vocab", options->vocab, "Vocabulary size (>= 259)");
  command->add_option("--hidden", options->hidden, "Hidden size");
  command->add_option("--layers", options->layers, "Number of transformer layers");
  command->add_option("--heads", options->heads, "Attention heads");
  command->add_option("--kv-heads", options->kv_heads, "Key/value heads (grouped-query attention)");
  command->add_option("--ffn", options->ffn, "Feed-forward size");
  command->add_option("--context", options->context, "Context length");
  command->add_option("--rope-theta", options->rope_theta, "RoPE frequency base");
  command->callback([options] {
    Result<model::LlamaShape> shape = shape_from(*options);
    check_command(shape.status());
    check_command(model::write_random_llama_model(options->output, *shape, options->seed)
                      .with_context(options->output));
    std::printf("wrote %s: %s, %lld parameters (%s weights), seed %llu\n", options->output.c_str(),
                std::string(model::llama_architecture_name(shape->architecture)).c_str(),
                static_cast<long long>(shape->parameter_count()),
                std::string(dtype_name(shape->weight_dtype)).c_str(),
                static_cast<unsigned long long>(options->seed));
  });
}

}  // namespace folio::app

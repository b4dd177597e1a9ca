// folio make-model: writes a deterministic random-weight Llama-family GGUF of any shape, so
// tests and benchmarks need no download; with --from-weights, writes trained weights given in
// Folio's weight interchange format (scripts/train_kjv/export.py) as a GGUF of any weight dtype.
//
// Interchange format (a directory):
//   manifest.json  {"format": "folio-weights-1", "architecture": "llama", "name": "...",
//                   "shape": {"vocab_size", "hidden_size", "num_layers", "num_heads",
//                             "num_kv_heads", "ffn_size", "context_length"},
//                   "rope_theta", "rms_norm_epsilon",
//                   "tensors": [{"name": GGUF name, "shape": [rows, row length] | [length],
//                                "offset": byte offset in weights.bin}, ...],
//                   "vocabulary": {"model": "llama", "tokens", "scores", "types" (llama token
//                                  types), "bos", "eos", "unknown", "add_bos", "add_eos",
//                                  "add_space_prefix"}}
//   weights.bin    the tensors as little-endian f32, row-major (PyTorch's [out, in] layout is
//                  the GGUF matrix of ggml shape [in, out]).
#include <bit>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/folio/commands.h"
#include "apps/folio/read_file.h"
#include "folio/gguf/gguf_inspect.h"
#include "folio/model/llama_model_file.h"
#include "folio/tensor/quantize.h"

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

// "f32, f16, ..., iq4_xs": the dtypes a model's matrices may take.
std::string weight_dtype_names() {
  std::string names;
  for (DType dtype : kAllDTypes) {
    if (!is_weight_dtype(dtype)) continue;
    if (!names.empty()) names += ", ";
    names += dtype_name(dtype);
  }
  return names;
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
  int64_t head_dim = 0;  // attention.key_length = value_length
  int64_t sliding_window = 0;
  double attention_soft_cap = 0;  // attn_logit_softcapping (gemma2)
  double final_soft_cap = 0;      // final_logit_softcapping (gemma2, gemma3)
  double rope_theta = 0;
  std::string rope_scaling = "none";  // none, linear, llama3, yarn
  double rope_scaling_factor = 0;     // 0: the scaling's default
  int64_t rope_original_context = 0;  // llama3 / yarn; 0: the default
  bool rope_frequency_factors = false;
  // NAME=DTYPE: the matrix NAME in another dtype than --dtype; a `*` in NAME stands for every
  // layer number ("blk.*.attn_v.weight=f16").
  std::vector<std::string> tensor_dtypes;
  std::string from_weights;  // interchange directory; empty: random weights
};

// One --tensor-dtype NAME=DTYPE into shape.tensor_dtypes, a `*` in NAME expanded to each layer.
Status add_tensor_dtype(std::string_view entry, model::LlamaShape& shape) {
  const size_t equals = entry.find('=');
  if (equals == std::string_view::npos) {
    return invalid_argument("--tensor-dtype '{}' is not NAME=DTYPE", entry);
  }
  const std::string_view name = entry.substr(0, equals);
  const std::optional<DType> dtype = dtype_from_name(entry.substr(equals + 1));
  if (!dtype) return invalid_argument("--tensor-dtype '{}': unknown dtype", entry);
  const size_t star = name.find('*');
  if (star == std::string_view::npos) {
    shape.tensor_dtypes[std::string(name)] = *dtype;
    return Status();
  }
  for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
    shape.tensor_dtypes[fmt::format("{}{}{}", name.substr(0, star), layer, name.substr(star + 1))] =
        *dtype;
  }
  return Status();
}

// --rope-scaling and its parameters; the other parameters keep RopeScaling's defaults.
Status set_rope_scaling(const MakeModelOptions& options, model::LlamaShape& shape) {
  ir::RopeScaling& scaling = shape.rope_scaling;
  if (options.rope_scaling == "none") {
    scaling.kind = ir::RopeScalingKind::kNone;
  } else if (options.rope_scaling == "linear") {
    scaling.kind = ir::RopeScalingKind::kLinear;
  } else if (options.rope_scaling == "llama3") {
    scaling.kind = ir::RopeScalingKind::kLlama3;
  } else if (options.rope_scaling == "yarn") {
    scaling.kind = ir::RopeScalingKind::kYarn;
  } else {
    return invalid_argument("unknown --rope-scaling '{}': use none, linear, llama3 or yarn",
                            options.rope_scaling);
  }
  if (options.rope_scaling_factor > 0) {
    scaling.factor = static_cast<float>(options.rope_scaling_factor);
  }
  if (options.rope_original_context > 0) {
    scaling.original_context_length = options.rope_original_context;
  }
  shape.rope_frequency_factors = options.rope_frequency_factors;
  return Status();
}

// What a Gemma file of llama.cpp's converter has beyond the preset (options override it):
// gemma2 soft caps 50 and 30 and a 4096-token window (llama.cpp's defaults), gemma3 a 1024-token
// window and a global RoPE base of 10^6 (Gemma 3 4B's). Gemma ties its output to the embedding.
void set_gemma_defaults(model::LlamaShape& shape) {
  switch (shape.architecture) {
    case model::LlamaArchitecture::kGemma2:
      shape.attention_logit_soft_cap = 50.0f;
      shape.final_logit_soft_cap = 30.0f;
      shape.sliding_window = 4096;
      return;
    case model::LlamaArchitecture::kGemma3:
      shape.sliding_window = 1024;
      shape.rope_theta = 1e6f;
      return;
    case model::LlamaArchitecture::kLlama:
    case model::LlamaArchitecture::kQwen2:
    case model::LlamaArchitecture::kQwen3:
    case model::LlamaArchitecture::kPhi3:
      return;
  }
}

Result<model::LlamaShape> shape_from(const MakeModelOptions& options) {
  auto preset = named_shapes().find(options.preset);
  if (preset == named_shapes().end()) {
    return invalid_argument("unknown preset '{}': use small, tiny or base", options.preset);
  }
  model::LlamaShape shape = preset->second;
  auto architecture = model::llama_architecture_from_name(options.architecture);
  if (!architecture) {
    return invalid_argument("unknown architecture '{}': use one of {}", options.architecture,
                            model::llama_architecture_names());
  }
  shape.architecture = *architecture;
  set_gemma_defaults(shape);
  std::optional<DType> dtype = dtype_from_name(options.dtype);
  if (!dtype)
    return invalid_argument("unknown dtype '{}': use {}", options.dtype, weight_dtype_names());
  shape.weight_dtype = *dtype;
  shape.tie_embeddings = options.tie_embeddings || model::llama_is_gemma(shape.architecture);
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
  override_with(options.head_dim, shape.key_length);
  override_with(options.sliding_window, shape.sliding_window);
  if (options.attention_soft_cap > 0) {
    shape.attention_logit_soft_cap = static_cast<float>(options.attention_soft_cap);
  }
  if (options.final_soft_cap > 0) {
    shape.final_logit_soft_cap = static_cast<float>(options.final_soft_cap);
  }
  if (options.rope_theta > 0) shape.rope_theta = static_cast<float>(options.rope_theta);
  FOLIO_RETURN_IF_ERROR(set_rope_scaling(options, shape));
  for (const std::string& entry : options.tensor_dtypes) {
    FOLIO_RETURN_IF_ERROR(add_tensor_dtype(entry, shape));
  }
  FOLIO_RETURN_IF_ERROR(model::validate_llama_shape(shape));
  return shape;
}

using Json = nlohmann::json;

Result<tokenizer::Vocabulary> vocabulary_from_json(const Json& json) {
  if (json.value("model", "") != "llama") {
    return invalid_argument("vocabulary.model must be \"llama\" (SentencePiece)");
  }
  tokenizer::Vocabulary vocabulary;
  vocabulary.tokens = json.at("tokens").get<std::vector<std::string>>();
  vocabulary.scores = json.at("scores").get<std::vector<float>>();
  for (int32_t type : json.at("types").get<std::vector<int32_t>>()) {
    vocabulary.types.push_back(static_cast<tokenizer::TokenType>(type));
  }
  vocabulary.bos = json.at("bos").get<tokenizer::TokenId>();
  vocabulary.eos = json.at("eos").get<tokenizer::TokenId>();
  vocabulary.unknown = json.at("unknown").get<tokenizer::TokenId>();
  vocabulary.add_bos = json.at("add_bos").get<bool>();
  vocabulary.add_eos = json.at("add_eos").get<bool>();
  vocabulary.add_space_prefix = json.at("add_space_prefix").get<bool>();
  FOLIO_RETURN_IF_ERROR(tokenizer::validate_vocabulary(vocabulary));
  return vocabulary;
}

// Copies each manifest tensor out of weights.bin (little-endian f32).
Status read_tensors(const Json& manifest, const std::string& weights,
                    std::map<std::string, std::vector<float>>& tensors) {
  static_assert(std::endian::native == std::endian::little, "weights.bin is little-endian");
  for (const Json& entry : manifest.at("tensors")) {
    const std::string name = entry.at("name").get<std::string>();
    int64_t count = 1;
    for (int64_t extent : entry.at("shape").get<std::vector<int64_t>>()) {
      if (extent <= 0) return invalid_argument("tensor {}: non-positive extent", name);
      count *= extent;
    }
    const uint64_t offset = entry.at("offset").get<uint64_t>();
    const uint64_t size = static_cast<uint64_t>(count) * sizeof(float);
    if (offset > weights.size() || size > weights.size() - offset) {
      return invalid_argument("tensor {}: bytes [{}, {}) lie outside weights.bin ({} bytes)", name,
                              offset, offset + size, weights.size());
    }
    std::vector<float> values(static_cast<size_t>(count));
    std::memcpy(values.data(), weights.data() + offset, size);
    if (!tensors.emplace(name, std::move(values)).second) {
      return invalid_argument("tensor {} is listed twice", name);
    }
  }
  return Status();
}

Result<model::LlamaWeights> parse_weights(const Json& manifest, const std::string& weights) {
  if (manifest.value("format", "") != "folio-weights-1") {
    return invalid_argument("manifest.json: format must be \"folio-weights-1\"");
  }
  model::LlamaWeights result;
  auto architecture =
      model::llama_architecture_from_name(manifest.at("architecture").get<std::string>());
  if (!architecture) return invalid_argument("manifest.json: unknown architecture");
  const Json& shape = manifest.at("shape");
  result.shape.architecture = *architecture;
  result.shape.vocab_size = shape.at("vocab_size").get<int64_t>();
  result.shape.hidden_size = shape.at("hidden_size").get<int64_t>();
  result.shape.num_layers = shape.at("num_layers").get<int64_t>();
  result.shape.num_heads = shape.at("num_heads").get<int64_t>();
  result.shape.num_kv_heads = shape.at("num_kv_heads").get<int64_t>();
  result.shape.ffn_size = shape.at("ffn_size").get<int64_t>();
  result.shape.context_length = shape.at("context_length").get<int64_t>();
  result.shape.rope_theta = manifest.at("rope_theta").get<float>();
  result.shape.rms_norm_epsilon = manifest.at("rms_norm_epsilon").get<float>();
  result.name = manifest.at("name").get<std::string>();
  FOLIO_ASSIGN_OR_RETURN(result.vocabulary, vocabulary_from_json(manifest.at("vocabulary")));
  FOLIO_RETURN_IF_ERROR(read_tensors(manifest, weights, result.tensors));
  return result;
}

// Reads DIR/manifest.json and DIR/weights.bin; the matrices will be written as `dtype`.
Result<model::LlamaWeights> read_interchange(const std::string& directory, DType dtype) {
  FOLIO_ASSIGN_OR_RETURN(std::string manifest_text, read_file(directory + "/manifest.json"));
  FOLIO_ASSIGN_OR_RETURN(std::string weights, read_file(directory + "/weights.bin"));
  try {
    Result<model::LlamaWeights> result = parse_weights(Json::parse(manifest_text), weights);
    if (!result.ok()) return result.status().with_context(directory);
    result->shape.weight_dtype = dtype;
    return result;
  } catch (const Json::exception& error) {
    return invalid_argument("{}/manifest.json: {}", directory, error.what());
  }
}

// --from-weights: the shape comes from the manifest; only --dtype applies.
void make_from_weights(const MakeModelOptions& options, const std::string& directory) {
  std::optional<DType> dtype = dtype_from_name(options.dtype);
  if (!dtype) {
    check_command(
        invalid_argument("unknown dtype '{}': use {}", options.dtype, weight_dtype_names()));
  }
  Result<model::LlamaWeights> weights = read_interchange(directory, *dtype);
  check_command(weights.status());
  Result<gguf::GgufWriter> writer = model::make_llama_writer(*weights);
  check_command(writer.status().with_context(directory));
  check_command(writer->write_file(options.output).with_context(options.output));
  std::printf("wrote %s: %s '%s', %lld parameters (%s weights), from %s\n", options.output.c_str(),
              std::string(model::llama_architecture_name(weights->shape.architecture)).c_str(),
              weights->name.c_str(), static_cast<long long>(weights->shape.parameter_count()),
              std::string(dtype_name(weights->shape.weight_dtype)).c_str(), directory.c_str());
}

}  // namespace

void add_make_model_command(CLI::App& app) {
  auto options = std::make_shared<MakeModelOptions>();
  CLI::App* command = app.add_subcommand(
      "make-model",
      "Write a deterministic random-weight Llama-family GGUF model, or trained weights");
  command->add_option("-o,--output", options->output, "Path of the GGUF file to write")->required();
  command->add_option("--preset", options->preset, "Base shape: small, tiny or base")
      ->capture_default_str();
  command->add_option("--dtype", options->dtype, "Weight type: " + weight_dtype_names())
      ->capture_default_str();
  command
      ->add_option("--arch", options->architecture,
                   "Architecture: " + model::llama_architecture_names())
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
  command->add_option("--sliding-window", options->sliding_window,
                      "Attention window in tokens (attention.sliding_window; Mistral: every "
                      "layer, Gemma: the local layers)");
  command->add_option("--attn-soft-cap", options->attention_soft_cap,
                      "Attention logit soft cap (attn_logit_softcapping; gemma2, default 50)");
  command->add_option("--final-soft-cap", options->final_soft_cap,
                      "Final logit soft cap (final_logit_softcapping; gemma2 default 30, gemma3 "
                      "none)");
  command->add_option("--head-dim", options->head_dim,
                      "Width of each attention head (attention.key_length = value_length), when "
                      "it is not hidden / heads");
  command->add_option("--context", options->context, "Context length");
  command->add_option("--rope-theta", options->rope_theta, "RoPE frequency base");
  command
      ->add_option("--rope-scaling", options->rope_scaling,
                   "RoPE scaling: none, linear, llama3 or yarn")
      ->capture_default_str();
  command->add_option("--rope-scaling-factor", options->rope_scaling_factor,
                      "RoPE scaling factor (rope.scaling.factor)");
  command->add_option("--rope-original-context", options->rope_original_context,
                      "Original context length of llama3 or yarn RoPE scaling");
  command->add_flag("--rope-freqs", options->rope_frequency_factors,
                    "Write a rope_freqs.weight tensor of per-pair frequency divisors");
  command->add_option("--tensor-dtype", options->tensor_dtypes,
                      "NAME=DTYPE: write matrix NAME in DTYPE instead of --dtype; `*` in NAME "
                      "stands for every layer (blk.*.attn_v.weight=f16); repeatable");
  command->add_option("--from-weights", options->from_weights,
                      "Write trained weights from this interchange directory (manifest.json + "
                      "weights.bin) instead of random ones; the shape comes from the manifest");
  command->callback([options] {
    if (!options->from_weights.empty()) {
      make_from_weights(*options, options->from_weights);
      return;
    }
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

// folio make-adapter: writes a LoRA adapter for a base model in llama.cpp's adapter format
// (docs/design/lora.md): a deterministic random one, so tests, benchmarks and the reference
// goldens need no trained adapter, or, with --from-weights, trained weights given in Folio's
// adapter interchange format. The base (-m) fixes the architecture and every target's shape;
// the written file is opened again as the engine would open it before the command reports
// success.
//
//   folio make-adapter -m BASE.gguf -o OUT.gguf [--rank 8] [--targets q,k,v,o,gate,up,down]
//                      [--dtype f16] [--alpha RANK] [--seed 1]
//   folio make-adapter -m BASE.gguf -o OUT.gguf --from-weights DIR [--dtype f16]
//
// --targets names the projections of every layer (q, k, v, o, gate, up, down) and `output`, the
// LM head (untied bases only). --dtype is f32, f16, bf16 or q8_0; q8_0 needs rows of whole
// 32-value blocks, so a tensor whose rows are not (lora_b whenever the rank is not a multiple
// of 32) is written f16, and the command says so.
//
// Interchange format (a directory, written by training scripts):
//   manifest.json  {"format": "folio-lora-1", "architecture": "llama", "name": "...",
//                   "alpha": float (PEFT's lora_alpha; 0: none),
//                   "tensors": [{"name": "blk.0.attn_q.weight.lora_a", "shape": [r, n_in],
//                                "offset": byte offset in weights.bin},
//                               {"name": "blk.0.attn_q.weight.lora_b", "shape": [n_out, r],
//                                "offset": ...}, ...]}
//   weights.bin    the tensors as little-endian f32, row-major. Shapes are PyTorch's (PEFT's
//                  lora_A.weight [r, in_features], lora_B.weight [out_features, r]): a matrix
//                  [rows, row length] is the GGUF tensor of ggml shape [row length, rows], as
//                  for model weights (scripts/train_kjv/export.py).
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/folio/commands.h"
#include "apps/folio/read_file.h"
#include "folio/gguf/gguf_file.h"
#include "folio/lora/adapter_file.h"
#include "folio/lora/adapter_writer.h"
#include "folio/model/llama_model_file.h"

namespace folio::app {
namespace {

struct MakeAdapterOptions {
  std::string base;
  std::string output;
  int64_t rank = 8;
  std::string targets = "q,k,v,o,gate,up,down";
  std::string dtype = "f16";
  std::optional<float> alpha;
  uint64_t seed = 1;
  std::string from_weights;  // interchange directory; empty: random weights
};

Result<model::LlamaShape> read_base_shape(const std::string& path) {
  FOLIO_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::open(path));
  // read_llama_shape's errors name the file already.
  return model::read_llama_shape(file);
}

Result<DType> adapter_dtype(const std::string& name) {
  std::optional<DType> dtype = dtype_from_name(name);
  if (!dtype || (*dtype != DType::kF32 && *dtype != DType::kF16 && *dtype != DType::kBF16 &&
                 *dtype != DType::kQ8_0)) {
    return invalid_argument("unknown adapter dtype '{}': use f32, f16, bf16 or q8_0", name);
  }
  return *dtype;
}

// "q,k,v,o,gate,up,down[,output]" into the options' projections and LM-head flag.
Status parse_targets(const std::string& list, lora::RandomAdapterOptions& options) {
  static const std::map<std::string, model::LlamaProjection> kProjections = {
      {"q", model::LlamaProjection::kQuery},   {"k", model::LlamaProjection::kKey},
      {"v", model::LlamaProjection::kValue},   {"o", model::LlamaProjection::kAttentionOutput},
      {"gate", model::LlamaProjection::kGate}, {"up", model::LlamaProjection::kUp},
      {"down", model::LlamaProjection::kDown}};
  options.projections.clear();
  options.output = false;
  std::set<std::string> seen;
  std::stringstream stream(list);
  std::string name;
  while (std::getline(stream, name, ',')) {
    if (!seen.insert(name).second) return invalid_argument("--targets lists '{}' twice", name);
    if (name == "output") {
      options.output = true;
    } else if (auto found = kProjections.find(name); found != kProjections.end()) {
      options.projections.push_back(found->second);
    } else {
      return invalid_argument(
          "--targets: unknown target '{}': use q, k, v, o, gate, up, down and output", name);
    }
  }
  return Status();
}

using Json = nlohmann::json;

// Copies each manifest tensor out of weights.bin (little-endian f32), shape kept.
Status read_tensors(const Json& manifest, const std::string& weights,
                    std::map<std::string, lora::AdapterTensorValues>& tensors) {
  static_assert(std::endian::native == std::endian::little, "weights.bin is little-endian");
  for (const Json& entry : manifest.at("tensors")) {
    const std::string name = entry.at("name").get<std::string>();
    lora::AdapterTensorValues tensor;
    tensor.shape = entry.at("shape").get<std::vector<int64_t>>();
    uint64_t count = 1;
    for (int64_t extent : tensor.shape) {
      // Bounded so the product below cannot overflow before it is compared with the file.
      if (extent <= 0 || extent > (int64_t{1} << 31)) {
        return invalid_argument("tensor {}: extent {} must be between 1 and 2^31", name, extent);
      }
      count *= static_cast<uint64_t>(extent);
      if (count > weights.size()) break;
    }
    const uint64_t offset = entry.at("offset").get<uint64_t>();
    const uint64_t size = count * sizeof(float);
    if (count > weights.size() || offset > weights.size() || size > weights.size() - offset) {
      return invalid_argument(
          "tensor {}: its {} values at byte {} lie outside weights.bin ({} "
          "bytes)",
          name, count, offset, weights.size());
    }
    tensor.values.resize(static_cast<size_t>(count));
    std::memcpy(tensor.values.data(), weights.data() + offset, size);
    if (!tensors.emplace(name, std::move(tensor)).second) {
      return invalid_argument("tensor {} is listed twice", name);
    }
  }
  return Status();
}

Result<lora::AdapterWeights> parse_manifest(const Json& manifest, const std::string& weights) {
  if (manifest.value("format", "") != "folio-lora-1") {
    return invalid_argument("manifest.json: format must be \"folio-lora-1\"");
  }
  lora::AdapterWeights result;
  const std::string architecture = manifest.at("architecture").get<std::string>();
  auto parsed = model::llama_architecture_from_name(architecture);
  if (!parsed) {
    return invalid_argument("manifest.json: unknown architecture '{}': use llama or qwen2",
                            architecture);
  }
  result.architecture = *parsed;
  result.name = manifest.at("name").get<std::string>();
  result.alpha = manifest.at("alpha").get<float>();
  FOLIO_RETURN_IF_ERROR(read_tensors(manifest, weights, result.tensors));
  return result;
}

// Reads DIR/manifest.json and DIR/weights.bin.
Result<lora::AdapterWeights> read_interchange(const std::string& directory) {
  FOLIO_ASSIGN_OR_RETURN(std::string manifest_text, read_file(directory + "/manifest.json"));
  FOLIO_ASSIGN_OR_RETURN(std::string weights, read_file(directory + "/weights.bin"));
  try {
    Result<lora::AdapterWeights> result = parse_manifest(Json::parse(manifest_text), weights);
    if (!result.ok()) return result.status().with_context(directory);
    return result;
  } catch (const Json::exception& error) {
    return invalid_argument("{}/manifest.json: {}", directory, error.what());
  }
}

// Writes the file, then opens it as the engine will; a file that does not open is removed.
Result<std::unique_ptr<lora::AdapterFile>> write_and_check(const gguf::GgufWriter& writer,
                                                           const std::string& path,
                                                           const model::LlamaShape& base) {
  FOLIO_RETURN_IF_ERROR(writer.write_file(path).with_context(path));
  Result<std::unique_ptr<lora::AdapterFile>> adapter = lora::AdapterFile::open(path, base);
  if (!adapter.ok()) {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
    return adapter.status().with_context("the written adapter does not open (removed)");
  }
  return adapter;
}

void report(const MakeAdapterOptions& options, const lora::AdapterFile& adapter, DType dtype,
            const std::string& origin) {
  int64_t written_f16 = 0;
  for (const lora::AdapterTensorPair& pair : adapter.pairs()) {
    written_f16 += (pair.a.dtype != dtype) + (pair.b.dtype != dtype);
  }
  std::printf("wrote %s: LoRA adapter for %s, %zu targets, rank up to %lld, alpha %g, %s, %s\n",
              options.output.c_str(), options.base.c_str(), adapter.pairs().size(),
              static_cast<long long>(adapter.max_rank()), static_cast<double>(adapter.alpha()),
              std::string(dtype_name(dtype)).c_str(), origin.c_str());
  if (written_f16 > 0) {
    std::printf(
        "note: %lld tensors written f16, not %s: their rows are not whole 32-value blocks "
        "(lora_b's rows hold rank values; use a rank that is a multiple of 32 for q8_0 "
        "throughout)\n",
        static_cast<long long>(written_f16), std::string(dtype_name(dtype)).c_str());
  }
}

void make_adapter(const MakeAdapterOptions& options) {
  Result<model::LlamaShape> base = read_base_shape(options.base);
  check_command(base.status());
  Result<DType> dtype = adapter_dtype(options.dtype);
  check_command(dtype.status());
  if (!options.from_weights.empty()) {
    Result<lora::AdapterWeights> weights = read_interchange(options.from_weights);
    check_command(weights.status());
    Result<gguf::GgufWriter> writer = lora::make_adapter_writer(*base, *weights, *dtype);
    check_command(writer.status().with_context(options.from_weights));
    auto adapter = write_and_check(*writer, options.output, *base);
    check_command(adapter.status());
    report(options, **adapter, *dtype, "from " + options.from_weights);
    return;
  }
  lora::RandomAdapterOptions random;
  check_command(parse_targets(options.targets, random));
  random.rank = options.rank;
  random.dtype = *dtype;
  random.alpha = options.alpha;
  random.seed = options.seed;
  Result<gguf::GgufWriter> writer = lora::make_random_adapter_writer(*base, random);
  check_command(writer.status());
  auto adapter = write_and_check(*writer, options.output, *base);
  check_command(adapter.status());
  report(options, **adapter, *dtype, "random, seed " + std::to_string(options.seed));
}

}  // namespace

void add_make_adapter_command(CLI::App& app) {
  auto options = std::make_shared<MakeAdapterOptions>();
  CLI::App* command = app.add_subcommand(
      "make-adapter",
      "Write a deterministic random LoRA adapter for a base model, or trained adapter weights");
  command->add_option("-m,--model", options->base, "The base model's GGUF file")->required();
  command->add_option("-o,--output", options->output, "Path of the adapter GGUF file to write")
      ->required();
  command->add_option("--dtype", options->dtype, "Tensor type: f32, f16, bf16, q8_0")
      ->capture_default_str();
  CLI::Option* from_weights = command->add_option(
      "--from-weights", options->from_weights,
      "Write trained weights from this interchange directory (manifest.json + weights.bin) "
      "instead of random ones");
  command->add_option("--rank", options->rank, "Rank of every pair (1 to the hidden size)")
      ->capture_default_str()
      ->excludes(from_weights);
  command
      ->add_option("--targets", options->targets,
                   "Projections to adapt: q, k, v, o, gate, up, down, output (the LM head)")
      ->capture_default_str()
      ->excludes(from_weights);
  command->add_option("--alpha", options->alpha, "LoRA alpha (default: the rank, scale 1)")
      ->excludes(from_weights);
  command->add_option("--seed", options->seed, "Random seed (same seed, same bytes)")
      ->capture_default_str()
      ->excludes(from_weights);
  command->callback([options] { make_adapter(*options); });
}

}  // namespace folio::app

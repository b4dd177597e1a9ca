// Writes the GGUF fuzzer's seed corpus into a directory: small valid files of every kind the
// reader meets (generated Llama models with their SentencePiece vocabularies, a byte-level BPE
// vocabulary, every metadata type, nested arrays, a custom alignment) and truncations of them.
//
// Usage: gguf_seed_corpus DIRECTORY
#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "folio/gguf/gguf_writer.h"
#include "folio/model/llama_model_file.h"
#include "folio/tokenizer/unicode.h"
#include "folio/tokenizer/vocabulary.h"

namespace {

using namespace folio;
using namespace folio::model;

bool write_bytes(const std::string& path, const std::vector<uint8_t>& bytes, size_t length) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return false;
  const bool ok = std::fwrite(bytes.data(), 1, length, file) == length;
  return std::fclose(file) == 0 && ok;
}

std::vector<uint8_t> tiny_model(DType dtype, LlamaArchitecture architecture, bool tied) {
  LlamaShape shape;
  shape.architecture = architecture;
  shape.vocab_size = 262;
  shape.hidden_size = 32;
  shape.num_layers = 1;
  shape.num_heads = 2;
  shape.num_kv_heads = 1;
  shape.ffn_size = 32;
  shape.context_length = 64;
  shape.weight_dtype = dtype;
  shape.tie_embeddings = tied;
  Result<gguf::GgufWriter> writer = make_random_llama_writer(shape, 1);
  FOLIO_CHECK(writer.ok(), "{}", writer.status().to_string());
  return *writer->write_to_buffer();
}

// 256 single-byte pieces in GPT-2's spelling, a few merges and two special tokens.
std::vector<uint8_t> bpe_vocabulary() {
  tokenizer::Vocabulary vocabulary;
  vocabulary.model = tokenizer::TokenizerModel::kBytePairEncoding;
  vocabulary.pre_tokenizer = tokenizer::PreTokenizerKind::kLlama3;
  uint32_t substitute = 0x100;
  for (uint32_t byte = 0; byte < 256; ++byte) {
    const bool printable =
        (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
    std::string piece;
    tokenizer::append_utf8(printable ? byte : substitute++, piece);
    vocabulary.tokens.push_back(piece);
  }
  for (const char* piece : {"\xc4\xa0t", "he", "\xc4\xa0the", "<|begin|>", "<|end|>"}) {
    vocabulary.tokens.push_back(piece);
  }
  vocabulary.merges = {"\xc4\xa0 t", "h e", "\xc4\xa0t he"};
  vocabulary.scores.assign(vocabulary.tokens.size(), 0.0f);
  vocabulary.types.assign(vocabulary.tokens.size(), tokenizer::TokenType::kNormal);
  vocabulary.types[259] = tokenizer::TokenType::kControl;
  vocabulary.types[260] = tokenizer::TokenType::kControl;
  vocabulary.bos = 259;
  vocabulary.eos = 260;
  vocabulary.add_bos = true;
  vocabulary.add_space_prefix = false;
  gguf::GgufWriter writer;
  tokenizer::write_vocabulary_metadata(vocabulary, writer);
  return *writer.write_to_buffer();
}

std::vector<uint8_t> every_metadata_type() {
  gguf::GgufWriter writer;
  writer.set("general.alignment", gguf::GgufValue::of<uint32_t>(64));
  writer.set("u8", gguf::GgufValue::of<uint8_t>(1));
  writer.set("i8", gguf::GgufValue::of<int8_t>(-1));
  writer.set("u16", gguf::GgufValue::of<uint16_t>(2));
  writer.set("i16", gguf::GgufValue::of<int16_t>(-2));
  writer.set("u32", gguf::GgufValue::of<uint32_t>(3));
  writer.set("i32", gguf::GgufValue::of<int32_t>(-3));
  writer.set("f32", gguf::GgufValue::of<float>(0.5f));
  writer.set("bool", gguf::GgufValue::of(true));
  writer.set("string", gguf::GgufValue::of_string("text"));
  writer.set("u64", gguf::GgufValue::of<uint64_t>(4));
  writer.set("i64", gguf::GgufValue::of<int64_t>(-4));
  writer.set("f64", gguf::GgufValue::of<double>(0.25));
  const std::array<int32_t, 3> values = {1, 2, 3};
  const std::array<bool, 2> flags = {true, false};
  writer.set("array.i32", gguf::GgufValue::array_of<int32_t>(values));
  writer.set("array.bool", gguf::GgufValue::array_of<bool>(flags));
  writer.set("array.string", gguf::GgufValue::array_of_strings({"a", "", "bc"}));
  writer.set("array.nested",
             gguf::GgufValue::array_of_arrays({gguf::GgufValue::array_of<int32_t>(values),
                                               gguf::GgufValue::array_of_strings({"x"})}));
  const std::array<std::byte, 8> bytes = {};
  FOLIO_CHECK(writer.add_tensor_bytes("t", DType::kF32, {2}, {bytes.begin(), bytes.end()}).ok());
  return *writer.write_to_buffer();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIRECTORY\n", argv[0]);
    return 2;
  }
  const std::string directory = argv[1];
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds = {
      {"llama_q4_0", tiny_model(DType::kQ4_0, LlamaArchitecture::kLlama, false)},
      {"qwen2_q8_0_tied", tiny_model(DType::kQ8_0, LlamaArchitecture::kQwen2, true)},
      {"bpe_vocabulary", bpe_vocabulary()},
      {"every_metadata_type", every_metadata_type()},
  };
  int written = 0;
  for (const auto& [name, bytes] : seeds) {
    if (!write_bytes(directory + "/" + name + ".gguf", bytes, bytes.size())) {
      std::perror(name.c_str());
      return 1;
    }
    ++written;
    // Truncations: inside the header, the metadata and the tensor data.
    for (size_t length :
         {size_t{3}, size_t{20}, bytes.size() / 7, bytes.size() / 2, bytes.size() - 1}) {
      if (length >= bytes.size()) continue;
      if (!write_bytes(fmt::format("{}/{}_truncated_{}.gguf", directory, name, length), bytes,
                       length)) {
        return 1;
      }
      ++written;
    }
  }
  std::printf("wrote %d seed files to %s\n", written, directory.c_str());
  return 0;
}

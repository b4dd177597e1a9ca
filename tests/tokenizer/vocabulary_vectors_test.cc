// Real vocabularies against llama.cpp's tokenizer test vectors: each ggml-vocab-NAME.gguf in
// ../shared/data is loaded the way a model's tokenizer is (Tokenizer::from_gguf over its
// tokenizer.ggml.* metadata), every input of NAME.gguf.inp is encoded, and the ids are compared
// with the matching line of NAME.gguf.out. The expected ids were produced by the models' own
// Hugging Face tokenizers (llama.cpp's convert scripts), so they are an independent reference.
//
// The files are split as llama.cpp's tests/test-tokenizer-0.cpp splits them: inputs are
// separated by "\n__ggml_vocab_test__\n" (the file ends with one, so no empty input follows the
// last), and the expected ids are the .out file's lines, stripped, space-separated. Inputs are
// encoded as that test does: no BOS/EOS (add_special false) and control tokens' text not
// matched (parse_special false).
//
// The data directory is FOLIO_SHARED_DATA_DIR (../shared/data beside the checkout), or the
// FOLIO_SHARED_DATA_DIR environment variable when set (a worktree elsewhere); the tests skip
// with a message when the files are absent.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "folio/gguf/gguf_file.h"
#include "folio/tokenizer/tokenizer.h"

namespace folio::tokenizer {
namespace {

struct VectorCase {
  std::string input;
  std::vector<TokenId> expected;
};

std::string shared_data_directory() {
  if (const char* override_directory = std::getenv("FOLIO_SHARED_DATA_DIR")) {
    return override_directory;
  }
  return FOLIO_SHARED_DATA_DIR;
}

std::string read_whole_file(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  std::ostringstream contents;
  contents << stream.rdbuf();
  return contents.str();
}

// test-tokenizer-0's split: every "\n__ggml_vocab_test__\n" ends an input.
std::vector<std::string> split_inputs(const std::string& raw) {
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  size_t position = 0;
  while (position < raw.size()) {
    const size_t next = raw.find(separator, position);
    if (next == std::string::npos) {
      inputs.push_back(raw.substr(position));
      break;
    }
    inputs.push_back(raw.substr(position, next - position));
    position = next + separator.size();
  }
  return inputs;
}

std::vector<std::vector<TokenId>> parse_expected(const std::string& raw) {
  std::vector<std::vector<TokenId>> lines;
  std::istringstream stream(raw);
  for (std::string line; std::getline(stream, line);) {
    std::istringstream numbers(line);
    std::vector<TokenId> ids;
    for (long id = 0; numbers >> id;) ids.push_back(static_cast<TokenId>(id));
    lines.push_back(std::move(ids));
  }
  return lines;
}

// The input with control characters and non-ASCII bytes escaped, for failure messages.
std::string printable(std::string_view text) {
  std::string out;
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (byte < 0x20 || byte >= 0x7F) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out;
}

std::string describe_mismatch(const Tokenizer& tokenizer, const std::vector<TokenId>& expected,
                              const std::vector<TokenId>& actual) {
  size_t first = 0;
  while (first < expected.size() && first < actual.size() && expected[first] == actual[first]) {
    ++first;
  }
  auto piece = [&](const std::vector<TokenId>& ids) -> std::string {
    if (first >= ids.size()) return "(end)";
    Result<std::string_view> text = tokenizer.token_piece(ids[first]);
    return fmt::format("{} '{}'", ids[first], text.ok() ? printable(*text) : "(out of range)");
  };
  return fmt::format(
      "first difference at position {}: expected {}, got {}\n  expected: {}\n  got:      {}", first,
      piece(expected), piece(actual), fmt::join(expected, " "), fmt::join(actual, " "));
}

class VocabularyVectorsTest : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabularyVectorsTest, EncodesEveryInputAsTheReference) {
  const std::string name = GetParam();
  const std::string base = shared_data_directory() + "/ggml-vocab-" + name + ".gguf";
  for (const std::string& path : {base, base + ".inp", base + ".out"}) {
    if (!std::filesystem::exists(path)) {
      GTEST_SKIP() << path << " is absent (../shared/data is not beside this checkout; set "
                   << "FOLIO_SHARED_DATA_DIR to its location)";
    }
  }
  Result<gguf::GgufFile> file = gguf::GgufFile::open(base);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  Result<Tokenizer> tokenizer = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(tokenizer.ok()) << name << ": " << tokenizer.status().to_string();

  const std::vector<std::string> inputs = split_inputs(read_whole_file(base + ".inp"));
  const std::vector<std::vector<TokenId>> expected = parse_expected(read_whole_file(base + ".out"));
  ASSERT_EQ(inputs.size(), expected.size()) << name << ": .inp and .out disagree on the count";
  // The files hold dozens of cases; a split that found one or two would test nothing.
  ASSERT_GE(inputs.size(), 40u) << name;

  const EncodeOptions options{.add_special = false, .parse_special = false};
  size_t passed = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<TokenId> actual = tokenizer->encode(inputs[i], options);
    if (actual == expected[i]) {
      ++passed;
      continue;
    }
    ADD_FAILURE() << name << " input " << i << " '" << printable(inputs[i])
                  << "': " << describe_mismatch(*tokenizer, expected[i], actual);
  }
  RecordProperty("vectors_passed", static_cast<int>(passed));
  RecordProperty("vectors_total", static_cast<int>(inputs.size()));
  std::cout << name << ": " << passed << " of " << inputs.size() << " vectors pass\n";
}

INSTANTIATE_TEST_SUITE_P(LlamaCppVocabularies, VocabularyVectorsTest,
                         ::testing::Values("gpt-2", "deepseek-llm", "starcoder", "falcon", "phi-3",
                                           "llama-spm"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string test_name;
                           for (const char* c = info.param; *c != '\0'; ++c) {
                             test_name += *c == '-' ? '_' : *c;
                           }
                           return test_name;
                         });

}  // namespace
}  // namespace folio::tokenizer

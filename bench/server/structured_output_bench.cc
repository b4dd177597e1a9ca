// Cost of structured output per generated token: computing the allowed-token mask over a real
// vocabulary (a trie walk with the grammar's automaton) in typical states, with the automaton's
// transition cache cold or warm and with the mask memo; applying a mask to a logits row; and a
// whole mask + accept step averaged over random generations (what the engine pays per token and
// sequence, the figure that predicts the TPOT overhead at batch 1 and 32).
//
// Vocabularies: the generated SentencePiece vocabulary of 32,000 tokens (always); Llama 2's
// 32,000-token SentencePiece and GPT-2's 50,257-token byte-level BPE vocabularies when
// ../shared/data (or FOLIO_SHARED_DATA_DIR) has them.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "folio/gguf/gguf_file.h"
#include "folio/server/json_schema_grammar.h"
#include "folio/server/structured_output.h"
#include "folio/server/vocabulary_index.h"
#include "folio/tokenizer/spm_vocabulary_builder.h"
#include "folio/tokenizer/tokenizer.h"

namespace folio::server {
namespace {

struct BenchVocabulary {
  std::string name;
  std::shared_ptr<const VocabularyIndex> index;
  int32_t eos;
};

std::vector<BenchVocabulary>& vocabularies() {
  static std::vector<BenchVocabulary> list = [] {
    std::vector<BenchVocabulary> result;
    auto add = [&](std::string name, Result<tokenizer::Tokenizer> tokenizer) {
      if (!tokenizer.ok()) return;
      Result<std::shared_ptr<const VocabularyIndex>> index = VocabularyIndex::create(*tokenizer);
      if (!index.ok()) return;
      result.push_back(BenchVocabulary{
          .name = std::move(name), .index = *index, .eos = tokenizer->eos().value_or(0)});
    };
    add("generated-spm-32000",
        tokenizer::Tokenizer::from_vocabulary(*tokenizer::build_llama_vocabulary(32000)));
    const char* directory = std::getenv("FOLIO_SHARED_DATA_DIR");
    const std::string data = directory ? directory : "../shared/data";
    for (const char* file : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"}) {
      Result<gguf::GgufFile> gguf = gguf::GgufFile::open(data + "/" + file);
      if (gguf.ok()) add(file, tokenizer::Tokenizer::from_gguf(*gguf));
    }
    return result;
  }();
  return list;
}

constexpr std::string_view kSchema = R"({"type": "object", "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 64}},
    "address": {"type": "object", "properties": {"street": {"type": "string"},
        "city": {"type": "string"}}, "required": ["street", "city"],
        "additionalProperties": false},
    "kind": {"enum": ["person", "robot", "other"]}},
  "required": ["name", "age", "tags", "address", "kind"], "additionalProperties": false})";

std::shared_ptr<const Grammar> schema_grammar() {
  static const auto grammar =
      std::make_shared<const Grammar>(std::move(compile_json_schema(kSchema)).value());
  return grammar;
}

// The states measured, each reached by feeding a prefix one single-byte token at a time.
struct MaskState {
  const char* name;
  const char* prefix;
};
constexpr MaskState kStates[] = {
    {"value_start", R"({"name": )"},           // a string must open: few tokens allowed
    {"inside_string", R"({"name": "Jo)"},      // almost every token allowed
    {"after_key", R"({"name": "Jo", "age")"},  // whitespace or ':'
    {"inside_number", R"({"name": "Jo", "age": 4)"},
    // maxLength 64: far from the end the plain-token shortcut holds; 4 characters before it,
    // the whole trie is walked.
    {"bounded_string_start", R"({"name": "Jo", "age": 4, "tags": ["ab)"},
    {"bounded_string_end",
     R"({"name": "Jo", "age": 4, "tags": ["abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij)"},
    {"enum_value",
     R"({"name": "Jo", "age": 4, "tags": [], "address": {"street": "a", "city": "b"}, "kind": )"},
};

std::unique_ptr<StructuredOutput> constraint_at(const BenchVocabulary& vocabulary,
                                                std::string_view prefix,
                                                const StructuredOutputOptions& options) {
  auto constraint = std::make_unique<StructuredOutput>(
      schema_grammar(), vocabulary.index, std::vector<int32_t>{vocabulary.eos}, options);
  for (char c : prefix) {
    int32_t token = -1;
    for (int32_t t = 0; t < vocabulary.index->vocab_size() && token < 0; ++t) {
      if (vocabulary.index->token_bytes(t) == std::string_view(&c, 1)) token = t;
    }
    if (token < 0 || !constraint->accept(token).ok()) std::abort();
  }
  return constraint;
}

int64_t count_allowed(const std::vector<uint64_t>& mask) {
  int64_t count = 0;
  for (uint64_t word : mask) count += __builtin_popcountll(word);
  return count;
}

// Cold: a new constraint each iteration, so every transition of the walk is computed (the
// first mask of a request in a state never seen before).
void BM_MaskCold(benchmark::State& state, const BenchVocabulary* vocabulary, MaskState at) {
  std::vector<uint64_t> mask;
  int64_t visited = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto constraint = constraint_at(*vocabulary, at.prefix, {});
    const int64_t before = constraint->stats().trie_nodes_visited;
    state.ResumeTiming();
    constraint->compute_allowed_tokens(mask);
    benchmark::DoNotOptimize(mask.data());
    visited = constraint->stats().trie_nodes_visited - before;
  }
  state.counters["allowed"] = static_cast<double>(count_allowed(mask));
  state.counters["trie_nodes"] = static_cast<double>(visited);
}

// Warm, no memo: the automaton has seen this state, the trie is walked again (a state that
// repeats while the memo is off or was emptied); with the plain-token shortcut or the whole trie.
void BM_MaskWarmWalk(benchmark::State& state, const BenchVocabulary* vocabulary, MaskState at,
                     bool shortcut) {
  StructuredOutputOptions options;
  options.plain_token_shortcut = shortcut;
  auto constraint = constraint_at(*vocabulary, at.prefix, options);
  std::vector<uint64_t> mask;
  constraint->compute_allowed_tokens(mask);
  for (auto _ : state) {
    constraint->compute_allowed_tokens(mask);
    benchmark::DoNotOptimize(mask.data());
  }
  state.counters["allowed"] = static_cast<double>(count_allowed(mask));
}

// Memoized: mask_logits on a logits row when the state's mask is in the memo (a hash lookup
// plus applying the bitset to vocab floats).
void BM_MaskLogitsMemoized(benchmark::State& state, const BenchVocabulary* vocabulary,
                           MaskState at) {
  auto constraint = constraint_at(*vocabulary, at.prefix, {});
  std::vector<float> logits(static_cast<size_t>(vocabulary->index->vocab_size()), 0.5f);
  constraint->mask_logits(logits);
  for (auto _ : state) {
    constraint->mask_logits(logits);
    benchmark::DoNotOptimize(logits.data());
  }
}

// One generated token end to end: mask_logits + choosing an allowed token + accept, averaged
// over random generations of the schema (each from a fresh constraint: cold automaton at the
// start of every request). Arg 1: masks memoized; 0: every mask walked.
void BM_GenerationStep(benchmark::State& state, const BenchVocabulary* vocabulary) {
  StructuredOutputOptions options;
  options.memoize_masks = state.range(0) != 0;
  std::vector<float> logits(static_cast<size_t>(vocabulary->index->vocab_size()));
  std::mt19937_64 rng(1);
  std::vector<int32_t> allowed;
  int64_t tokens = 0;
  int64_t generations = 0;
  int64_t walks = 0;
  auto constraint = std::make_unique<StructuredOutput>(
      schema_grammar(), vocabulary->index, std::vector<int32_t>{vocabulary->eos}, options);
  for (auto _ : state) {
    if (constraint->must_end() || tokens % 2000 == 1999) {
      walks += constraint->stats().masks_computed;
      constraint = std::make_unique<StructuredOutput>(
          schema_grammar(), vocabulary->index, std::vector<int32_t>{vocabulary->eos}, options);
      ++generations;
    }
    constraint->mask_logits(logits);
    // The driver's choice (not measured): prefer single-byte tokens half the time so strings
    // end. Timed: mask_logits and accept, the constraint's whole work per token.
    state.PauseTiming();
    allowed.clear();
    const bool prefer_short = (rng() & 1) != 0;
    for (size_t t = 0; t < logits.size(); ++t) {
      if (logits[t] == 0.0f &&
          (!prefer_short || vocabulary->index->token_bytes(static_cast<int32_t>(t)).size() <= 1)) {
        allowed.push_back(static_cast<int32_t>(t));
      }
    }
    if (allowed.empty()) {
      for (size_t t = 0; t < logits.size(); ++t) {
        if (logits[t] == 0.0f) allowed.push_back(static_cast<int32_t>(t));
      }
    }
    const int32_t token = allowed[rng() % allowed.size()];
    std::fill(logits.begin(), logits.end(), 0.0f);
    state.ResumeTiming();
    if (!constraint->accept(token).ok()) std::abort();
    ++tokens;
  }
  walks += constraint->stats().masks_computed;
  state.counters["automaton_states"] = constraint->automaton().num_states();
  state.counters["automaton_kib"] =
      static_cast<double>(constraint->automaton().memory_bytes()) / 1024;
  state.counters["generations"] = static_cast<double>(generations);
  state.counters["walks_per_token"] = static_cast<double>(walks) / static_cast<double>(tokens);
}

void BM_VocabularyIndexCreate(benchmark::State& state) {
  const tokenizer::Tokenizer tokenizer =
      *tokenizer::Tokenizer::from_vocabulary(*tokenizer::build_llama_vocabulary(32000));
  for (auto _ : state) {
    auto index = VocabularyIndex::create(tokenizer);
    benchmark::DoNotOptimize(index);
  }
}
BENCHMARK(BM_VocabularyIndexCreate)->Unit(benchmark::kMillisecond);

void BM_CompileSchema(benchmark::State& state) {
  for (auto _ : state) {
    auto grammar = compile_json_schema(kSchema);
    benchmark::DoNotOptimize(grammar);
  }
}
BENCHMARK(BM_CompileSchema)->Unit(benchmark::kMicrosecond);

const bool kRegistered = [] {
  for (const BenchVocabulary& vocabulary : vocabularies()) {
    for (const MaskState& at : kStates) {
      benchmark::RegisterBenchmark(("BM_MaskCold/" + vocabulary.name + "/" + at.name).c_str(),
                                   BM_MaskCold, &vocabulary, at)
          ->Unit(benchmark::kMicrosecond);
      for (bool shortcut : {true, false}) {
        const std::string name = "BM_MaskWarmWalk/" + vocabulary.name + "/" + at.name +
                                 (shortcut ? "/plain_shortcut" : "/full_trie");
        benchmark::RegisterBenchmark(name.c_str(), BM_MaskWarmWalk, &vocabulary, at, shortcut)
            ->Unit(benchmark::kMicrosecond);
      }
      benchmark::RegisterBenchmark(
          ("BM_MaskLogitsMemoized/" + vocabulary.name + "/" + at.name).c_str(),
          BM_MaskLogitsMemoized, &vocabulary, at)
          ->Unit(benchmark::kMicrosecond);
    }
    benchmark::RegisterBenchmark(("BM_GenerationStep/" + vocabulary.name).c_str(),
                                 BM_GenerationStep, &vocabulary)
        ->Arg(0)
        ->Arg(1)
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
}  // namespace folio::server

BENCHMARK_MAIN();

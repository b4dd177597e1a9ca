// Sampler and generator: reference vectors for the PRNG, exact penalties, truncation sets
// against independent computations, and draw frequencies against the distribution (fixed seeds).
#include "folio/engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "folio/base/random.h"
#include "folio/kernels/cpu/vector_ops.h"

namespace folio::engine {
namespace {

TEST(RandomTest, SplitMix64MatchesPublishedOutputs) {
  // Seed 1234567, as listed with the algorithm's reference implementation (Rosetta Code).
  SplitMix64 generator(1234567);
  EXPECT_EQ(generator.next(), 6457827717110365317ULL);
  EXPECT_EQ(generator.next(), 3203168211198807973ULL);
  EXPECT_EQ(generator.next(), 9817491932198370423ULL);
  EXPECT_EQ(generator.next(), 4593380528125082431ULL);
  EXPECT_EQ(generator.next(), 16408922859458223821ULL);
}

TEST(RandomTest, Xoshiro256StarStarMatchesTheReferenceImplementation) {
  // State {1, 2, 3, 4}, outputs of the authors' xoshiro256starstar.c.
  auto generator = Xoshiro256StarStar::from_state({1, 2, 3, 4});
  EXPECT_EQ(generator.next(), 11520ULL);
  EXPECT_EQ(generator.next(), 0ULL);
  EXPECT_EQ(generator.next(), 1509978240ULL);
  EXPECT_EQ(generator.next(), 1215971899390074240ULL);
  // Seeding through SplitMix64 (values from an independent Python implementation).
  Xoshiro256StarStar seeded(42);
  EXPECT_EQ(seeded.next(), 1546998764402558742ULL);
  EXPECT_EQ(seeded.next(), 6990951692964543102ULL);
  Xoshiro256StarStar doubles(42);
  EXPECT_DOUBLE_EQ(doubles.next_double(), 0.08386297105988216);
  EXPECT_DOUBLE_EQ(doubles.next_double(), 0.3789802506626686);
}

TEST(GreedyTest, PicksTheLowestIndexAmongEqualMaximaAndNeverNaN) {
  const float nan = std::nanf("");
  const std::vector<float> logits = {1.0f, nan, 3.0f, 3.0f, -2.0f};
  EXPECT_EQ(*greedy_token(logits), 2);
  const std::vector<float> leading_nan = {nan, -5.0f, -4.0f};
  EXPECT_EQ(*greedy_token(leading_nan), 2);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> nothing = {nan, -inf};
  EXPECT_EQ(greedy_token(nothing).status().code(), StatusCode::kInvalidArgument);
}

TEST(GreedyTest, AgreesWithASequentialScanOnRandomRowsOnEverySimdPath) {
  const float nan = std::nanf("");
  const float inf = std::numeric_limits<float>::infinity();
  for (const kernels::cpu::SimdPath path :
       {kernels::cpu::SimdPath::kPortable, kernels::cpu::SimdPath::kAvx2,
        kernels::cpu::SimdPath::kAvx512}) {
    if (!kernels::cpu::simd_path_supported(path)) continue;
    const kernels::cpu::SimdPath previous = kernels::cpu::active_simd_path();
    kernels::cpu::set_simd_path_for_testing(path);
    SplitMix64 random(5);
    for (int trial = 0; trial < 600; ++trial) {
      // Short rows and rows of several of greedy_token's chunks (256), with partial ones.
      const size_t size = 1 + random.next() % (trial % 3 == 0 ? 1300 : 70);
      std::vector<float> logits(size);
      // Few distinct values, so ties are common (also across chunks); some NaN and infinities,
      // and some rows where one region is all NaN or -infinity.
      const uint64_t blank_begin = random.next() % size;
      const uint64_t blank_end = blank_begin + random.next() % (size - blank_begin + 1);
      for (size_t index = 0; index < size; ++index) {
        const uint64_t kind = random.next() % 10;
        float& logit = logits[index];
        logit = index >= blank_begin && index < blank_end ? (kind % 2 == 0 ? nan : -inf)
                : kind == 0                               ? nan
                : kind == 1                               ? -inf
                : kind == 2 && trial % 7 == 0             ? inf
                                                          : static_cast<float>(random.next() % 5);
      }
      int32_t expected = -1;
      for (size_t index = 0; index < size; ++index) {
        if (logits[index] > (expected < 0 ? -inf : logits[expected])) {
          expected = static_cast<int32_t>(index);
        }
      }
      const Result<int32_t> token = greedy_token(logits);
      if (expected < 0) {
        EXPECT_FALSE(token.ok());
      } else {
        EXPECT_EQ(*token, expected)
            << "trial " << trial << " path " << kernels::cpu::simd_path_name(path);
      }
    }
    kernels::cpu::set_simd_path_for_testing(previous);
  }
}

TEST(PenaltyTest, RepetitionPresenceAndFrequencyChangeTheRightLogitsByTheRightAmounts) {
  const std::vector<int32_t> prompt = {1, 1, 3};
  TokenHistory history(prompt);
  history.add_generated(3);
  history.add_generated(4);
  history.add_generated(4);
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  std::vector<float> logits = {1.0f, 2.0f, 3.0f, -4.0f, 6.0f, 7.0f};
  apply_penalties(logits, params, history);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);                         // never seen
  EXPECT_FLOAT_EQ(logits[1], 1.0f);                         // prompt only: 2 / 2, once
  EXPECT_FLOAT_EQ(logits[2], 3.0f);                         // never seen
  EXPECT_FLOAT_EQ(logits[3], -4.0f * 2.0f - 0.5f - 0.25f);  // prompt and output: once each way
  EXPECT_FLOAT_EQ(logits[4], 6.0f / 2.0f - 0.5f - 0.5f);    // generated twice
  EXPECT_FLOAT_EQ(logits[5], 7.0f);
}

TEST(PenaltyTest, PenaltiesApplyBeforeGreedy) {
  TokenHistory history;
  history.add_generated(0);
  SamplingParams params;
  params.temperature = 0.0f;
  params.frequency_penalty = 2.0f;
  std::vector<float> logits = {1.0f, 0.5f};
  Xoshiro256StarStar generator(1);
  EXPECT_EQ(*Sampler().sample(logits, params, history, generator), 1);
}

// softmax(logits / temperature) in double, independent of the sampler.
std::vector<double> reference_softmax(std::span<const float> logits, double temperature) {
  double max_value = -INFINITY;
  for (float logit : logits) max_value = std::max(max_value, logit / temperature);
  std::vector<double> probabilities;
  double total = 0.0;
  for (float logit : logits) {
    probabilities.push_back(std::exp(logit / temperature - max_value));
    total += probabilities.back();
  }
  for (double& probability : probabilities) probability /= total;
  return probabilities;
}

std::vector<float> test_logits(int32_t vocab, uint64_t seed) {
  SplitMix64 generator(seed);
  std::vector<float> logits;
  for (int32_t index = 0; index < vocab; ++index) {
    logits.push_back(static_cast<float>(generator.next() >> 40) * 0x1.0p-24f * 6.0f - 3.0f);
  }
  return logits;
}

std::map<int32_t, double> as_map(const std::vector<Candidate>& candidates) {
  std::map<int32_t, double> result;
  double total = 0.0;
  for (const Candidate& candidate : candidates) {
    result[candidate.token] = candidate.probability;
    total += candidate.probability;
  }
  EXPECT_NEAR(total, 1.0, 1e-12);
  return result;
}

TEST(LogitBiasTest, BiasIsAddedBeforePenaltiesAndGreedy) {
  TokenHistory history;
  history.add_generated(1);
  SamplingParams params;
  params.temperature = 0.0f;
  params.presence_penalty = 1.0f;
  // Token 1 (2.0) is penalized to 1.0 after its bias of +0.5 (2.5 - 1 = 1.5); token 0 (1.0)
  // gets +0.25: 1.25 < 1.5, so token 1 still wins, which it would not without its bias.
  params.logit_bias = {{0, 0.25f}, {1, 0.5f}};
  std::vector<float> logits = {1.0f, 2.0f, -3.0f};
  Xoshiro256StarStar generator(1);
  EXPECT_EQ(*Sampler().sample(logits, params, history, generator), 1);
  EXPECT_FLOAT_EQ(logits[0], 1.25f);
  EXPECT_FLOAT_EQ(logits[1], 1.5f);
  EXPECT_FLOAT_EQ(logits[2], -3.0f);
}

TEST(LogitBiasTest, SamplingDrawsFromTheBiasedDistribution) {
  const std::vector<float> logits = test_logits(30, 9);
  SamplingParams params;
  params.temperature = 0.8f;
  params.logit_bias = {{4, 2.0f}, {11, -100.0f}, {4, 1.0f}};  // a token listed twice: both add
  std::vector<float> biased = logits;
  biased[4] += 3.0f;
  biased[11] -= 100.0f;
  const std::vector<double> expected = reference_softmax(biased, static_cast<double>(0.8f));
  std::vector<float> scratch = logits;
  const auto kept = as_map(*Sampler().distribution(scratch, params, TokenHistory()));
  ASSERT_EQ(kept.size(), logits.size());
  for (size_t token = 0; token < logits.size(); ++token) {
    EXPECT_NEAR(kept.at(static_cast<int32_t>(token)), expected[token], 1e-9) << token;
  }
}

TEST(LogitBiasTest, ValidationNamesTheFieldForBadTokensAndValues) {
  SamplingParams params;
  params.logit_bias = {{3, 100.0f}, {0, -100.0f}};
  EXPECT_TRUE(params.validate(10).ok());
  for (const LogitBias bad : {LogitBias{10, 1.0f}, LogitBias{-1, 1.0f}, LogitBias{2, 100.5f},
                              LogitBias{2, -101.0f}, LogitBias{2, std::nanf("")}}) {
    params.logit_bias = {bad};
    const Status status = params.validate(10);
    ASSERT_FALSE(status.ok()) << bad.token << " " << bad.bias;
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("logit_bias"), std::string::npos) << status.message();
  }
}

TEST(SamplerTest, TopKKeepsTheKLargestRenormalized) {
  const std::vector<float> logits = test_logits(50, 3);
  SamplingParams params;
  params.temperature = 0.7f;
  params.top_k = 7;
  std::vector<float> scratch = logits;
  const auto kept = as_map(*Sampler().distribution(scratch, params, TokenHistory()));
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const std::vector<double> full = reference_softmax(logits, static_cast<double>(0.7f));
  double mass = 0.0;
  for (int32_t rank = 0; rank < 7; ++rank) mass += full[order[rank]];
  ASSERT_EQ(kept.size(), 7u);
  for (int32_t rank = 0; rank < 7; ++rank) {
    ASSERT_TRUE(kept.contains(order[rank]));
    EXPECT_NEAR(kept.at(order[rank]), full[order[rank]] / mass, 1e-9);
  }
}

TEST(SamplerTest, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities 0.4, 0.3, 0.2, 0.1 (logits are their logs).
  const std::vector<float> logits = {std::log(0.1f), std::log(0.4f), std::log(0.2f),
                                     std::log(0.3f)};
  auto kept_tokens = [&](float top_p) {
    SamplingParams params;
    params.top_p = top_p;
    std::vector<float> scratch = logits;
    const std::vector<Candidate> kept = *Sampler().distribution(scratch, params, TokenHistory());
    std::set<int32_t> tokens;
    for (const Candidate& candidate : kept) tokens.insert(candidate.token);
    return tokens;
  };
  EXPECT_EQ(kept_tokens(0.3f), (std::set<int32_t>{1}));
  EXPECT_EQ(kept_tokens(0.5f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(kept_tokens(0.75f), (std::set<int32_t>{1, 3, 2}));
  EXPECT_EQ(kept_tokens(0.95f), (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(kept_tokens(1.0f), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(SamplerTest, MinPDropsTokensBelowTheThreshold) {
  const std::vector<float> logits = test_logits(40, 5);
  const std::vector<double> full = reference_softmax(logits, 1.0);
  const double max_probability = *std::max_element(full.begin(), full.end());
  SamplingParams params;
  params.min_p = 0.3f;
  std::vector<float> scratch = logits;
  const auto kept = as_map(*Sampler().distribution(scratch, params, TokenHistory()));
  double mass = 0.0;
  for (size_t token = 0; token < full.size(); ++token) {
    const bool expected = full[token] >= 0.3 * max_probability;
    EXPECT_EQ(kept.contains(static_cast<int32_t>(token)), expected) << token;
    if (expected) mass += full[token];
  }
  for (const auto& [token, probability] : kept) {
    EXPECT_NEAR(probability, full[token] / mass, 1e-9);
  }
}

TEST(SamplerTest, DrawFrequenciesFollowTheDistributionAndStayInsideIt) {
  const std::vector<float> logits = test_logits(30, 9);
  SamplingParams params;
  params.temperature = 1.3f;
  params.top_k = 12;
  params.top_p = 0.85f;
  params.min_p = 0.05f;
  std::vector<float> scratch = logits;
  Sampler sampler;
  const auto expected = as_map(*sampler.distribution(scratch, params, TokenHistory()));
  Xoshiro256StarStar generator(2024);
  constexpr int kDraws = 40000;
  std::map<int32_t, int> counts;
  for (int draw = 0; draw < kDraws; ++draw) {
    scratch = logits;
    ++counts[*sampler.sample(scratch, params, TokenHistory(), generator)];
  }
  for (const auto& [token, count] : counts) {
    ASSERT_TRUE(expected.contains(token)) << "drew token " << token << " outside the kept set";
  }
  for (const auto& [token, probability] : expected) {
    const double sigma = std::sqrt(kDraws * probability * (1.0 - probability));
    EXPECT_NEAR(counts[token], kDraws * probability, 5.0 * sigma + 1.0) << token;
  }
}

TEST(SamplerTest, TheSameSeedGivesTheSameSequence) {
  const std::vector<float> logits = test_logits(64, 11);
  SamplingParams params;
  params.temperature = 1.0f;
  auto draws = [&](uint64_t seed) {
    Xoshiro256StarStar generator(seed);
    Sampler sampler;
    std::vector<int32_t> tokens;
    for (int draw = 0; draw < 50; ++draw) {
      std::vector<float> scratch = logits;
      tokens.push_back(*sampler.sample(scratch, params, TokenHistory(), generator));
    }
    return tokens;
  };
  EXPECT_EQ(draws(77), draws(77));
  EXPECT_NE(draws(77), draws(78));
}

TEST(SamplerTest, TemperatureSharpensOrFlattensTheDistribution) {
  const std::vector<float> logits = {0.5f, 1.0f, 0.9f, -1.0f};
  for (float temperature : {0.01f, 0.5f, 1.0f, 4.0f}) {
    SamplingParams params;
    params.temperature = temperature;
    std::vector<float> scratch = logits;
    const auto kept = as_map(*Sampler().distribution(scratch, params, TokenHistory()));
    const std::vector<double> expected =
        reference_softmax(logits, static_cast<double>(temperature));
    for (int32_t token = 0; token < 4; ++token) {
      EXPECT_NEAR(kept.at(token), expected[token], 1e-12) << temperature;
    }
  }
  SamplingParams cold;
  cold.temperature = 0.01f;
  std::vector<float> scratch = logits;
  EXPECT_GT(as_map(*Sampler().distribution(scratch, cold, TokenHistory())).at(1), 0.99);
}

TEST(SamplerTest, NonFiniteLogitsAreHandled) {
  const float nan = std::nanf("");
  const float inf = std::numeric_limits<float>::infinity();
  Xoshiro256StarStar generator(3);
  SamplingParams params;
  std::vector<float> some_nan = {nan, 0.0f, -inf, nan};
  EXPECT_EQ(*Sampler().sample(some_nan, params, TokenHistory(), generator), 1);
  std::vector<float> all_nan = {nan, nan};
  EXPECT_EQ(Sampler().sample(all_nan, params, TokenHistory(), generator).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<float> plus_inf = {0.0f, inf};
  EXPECT_FALSE(Sampler().sample(plus_inf, params, TokenHistory(), generator).ok());
}

TEST(SamplingParamsTest, RejectsValuesOutOfRange) {
  auto invalid = [](auto mutate) {
    SamplingParams params;
    mutate(params);
    return params.validate(100).code() == StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(SamplingParams{}.validate(100).ok());
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.temperature = -1.0f; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.temperature = std::nanf(""); }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.top_k = -1; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.top_k = 101; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.top_p = 0.0f; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.top_p = 1.5f; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.min_p = -0.1f; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.repetition_penalty = 0.0f; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.presence_penalty = 2.5f; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.frequency_penalty = -3.0f; }));
}

}  // namespace
}  // namespace folio::engine

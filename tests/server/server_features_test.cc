// The OpenAI features an evaluation harness and a tool-using client rely on, over real sockets
// with the real tiny model: echo + logprobs scores a text exactly as `folio perplexity` does,
// best_of returns the choices with the highest cumulative logprob, n choices of a seeded
// request are reproducible and streamed equal to whole, and /tokenize round-trips through
// /detokenize.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "folio/engine/perplexity.h"
#include "server_test_util.h"

namespace folio::server {
namespace {

using testing::Json;
using testing::post;

class ServerFeaturesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_engine_ = testing::start_tiny_model_engine().release();
    server_ =
        testing::start_server(serve_model_engine(*model_engine_, "tiny"), {}, &port_).release();
  }
  static void TearDownTestSuite() {
    server_->shutdown();
    delete server_;
    model_engine_->engine().stop();
    delete model_engine_;
  }

  static Json completion(const Json& body) {
    const testing::HttpAnswer answer = post(port_, "/v1/completions", body.dump());
    EXPECT_EQ(answer.status, 200) << answer.body;
    return answer.json();
  }

  static inline engine::ModelEngine* model_engine_ = nullptr;
  static inline Server* server_ = nullptr;
  static inline int port_ = 0;
};

// lm-evaluation-harness's local-completions model scores a text with echo, logprobs and
// max_tokens 0, summing the prompt's token logprobs: the sum must be what perplexity computes.
TEST_F(ServerFeaturesTest, EchoLogprobsSumToThePerplexityOfTheText) {
  const std::string text = "In the beginning God created the heaven and the earth. And the earth";
  const Json answer = completion(
      {{"model", "tiny"}, {"prompt", text}, {"echo", true}, {"logprobs", 2}, {"max_tokens", 0}});
  const Json& choice = answer["choices"][0];
  EXPECT_EQ(choice["text"], text);
  EXPECT_EQ(answer["usage"]["completion_tokens"], 0);
  const Json& logprobs = choice["logprobs"]["token_logprobs"];
  ASSERT_GE(logprobs.size(), 10u);
  EXPECT_TRUE(logprobs[0].is_null());  // the first token has no context
  double sum = 0;
  for (size_t i = 1; i < logprobs.size(); ++i) {
    ASSERT_TRUE(logprobs[i].is_number());
    sum += logprobs[i].get<double>();
    const Json& top = choice["logprobs"]["top_logprobs"][i];
    EXPECT_LE(top.size(), 2u);
    for (const auto& [token, logprob] : top.items()) EXPECT_LE(logprob.get<double>(), 0.0);
  }
  EXPECT_EQ(answer["usage"]["prompt_tokens"], logprobs.size());

  // The reference: a second engine over the same model, one window covering the whole text.
  engine::ModelEngineOptions options = testing::tiny_engine_options();
  options.max_logit_rows = 64;
  Result<std::unique_ptr<engine::ModelEngine>> reference =
      engine::ModelEngine::create(testing::make_tiny_model(), options);
  ASSERT_TRUE(reference.ok()) << reference.status();
  engine::PerplexityOptions perplexity_options;
  perplexity_options.context = static_cast<int32_t>(logprobs.size());
  perplexity_options.stride = perplexity_options.context;
  Result<engine::PerplexityResult> perplexity =
      engine::compute_text_perplexity(**reference, text, perplexity_options);
  ASSERT_TRUE(perplexity.ok()) << perplexity.status();
  ASSERT_EQ(perplexity->num_scored_tokens, static_cast<int64_t>(logprobs.size()) - 1);
  const double reference_sum =
      -perplexity->mean_nll * static_cast<double>(perplexity->num_scored_tokens);
  EXPECT_NEAR(sum, reference_sum, 1e-6 * std::abs(reference_sum) + 1e-4);
}

TEST_F(ServerFeaturesTest, BestOfReturnsTheChoicesWithTheHighestCumulativeLogprob) {
  const Json base = {{"model", "tiny"},    {"prompt", "The sea"}, {"max_tokens", 6},
                     {"temperature", 1.0}, {"seed", 21},          {"ignore_eos", true}};
  Json all_body = base;
  all_body["n"] = 4;
  all_body["logprobs"] = 0;
  const Json all = completion(all_body);
  ASSERT_EQ(all["choices"].size(), 4u);
  std::vector<std::pair<double, std::string>> ranked;
  for (const Json& choice : all["choices"]) {
    double sum = 0;
    for (const Json& logprob : choice["logprobs"]["token_logprobs"]) sum += logprob.get<double>();
    ranked.emplace_back(sum, choice["text"].get<std::string>());
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& left, const auto& right) { return left.first > right.first; });
  Json best_body = base;
  best_body["n"] = 2;
  best_body["best_of"] = 4;
  const Json best = completion(best_body);
  ASSERT_EQ(best["choices"].size(), 2u);
  EXPECT_EQ(best["choices"][0]["index"], 0);
  EXPECT_EQ(best["choices"][1]["index"], 1);
  EXPECT_EQ(best["choices"][0]["text"], ranked[0].second);
  EXPECT_EQ(best["choices"][1]["text"], ranked[1].second);
  EXPECT_TRUE(best["choices"][0]["logprobs"].is_null());  // best_of alone asks for none
}

TEST_F(ServerFeaturesTest, SeededChoicesAreReproducibleAndStreamedEqualWhole) {
  const Json body = {{"model", "tiny"},
                     {"prompt", Json::array({"The sea", "A lamp"})},
                     {"n", 3},
                     {"max_tokens", 5},
                     {"temperature", 1.0},
                     {"seed", 4},
                     {"ignore_eos", true}};
  const Json first = completion(body);
  const Json second = completion(body);
  ASSERT_EQ(first["choices"].size(), 6u);
  EXPECT_EQ(first["choices"], second["choices"]);
  EXPECT_EQ(first["usage"]["completion_tokens"], 30);
  Json streamed_body = body;
  streamed_body["stream"] = true;
  const testing::HttpAnswer streamed = post(port_, "/v1/completions", streamed_body.dump());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::vector<std::string> texts(6);
  for (const std::string& payload : testing::sse_payloads(streamed.body)) {
    if (payload == "[DONE]") continue;
    const Json chunk = Json::parse(payload);
    for (const Json& choice : chunk["choices"]) {
      texts.at(choice["index"].get<size_t>()) += choice["text"].get<std::string>();
    }
  }
  for (size_t index = 0; index < texts.size(); ++index) {
    EXPECT_EQ(texts[index], first["choices"][index]["text"]) << index;
  }
}

TEST_F(ServerFeaturesTest, TokenizeRoundTripsThroughDetokenize) {
  const std::string text = "Let there be light";
  const testing::HttpAnswer tokenized =
      post(port_, "/tokenize", Json{{"prompt", text}, {"add_special_tokens", false}}.dump());
  ASSERT_EQ(tokenized.status, 200) << tokenized.body;
  const Json tokens = tokenized.json()["tokens"];
  EXPECT_EQ(tokens.get<std::vector<int32_t>>(),
            model_engine_->model().tokenizer().encode(text, {.add_special = false}));
  const testing::HttpAnswer detokenized =
      post(port_, "/detokenize", Json{{"tokens", tokens}}.dump());
  ASSERT_EQ(detokenized.status, 200) << detokenized.body;
  EXPECT_EQ(detokenized.json()["prompt"], text);
  testing::expect_error(post(port_, "/detokenize", R"({"tokens": [99999999]})"), 400,
                        kInvalidRequestError);
}

}  // namespace
}  // namespace folio::server

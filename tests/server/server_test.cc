// The server over real loopback sockets: each endpoint, every kind of bad input (400 with an
// OpenAI error body), authentication, body limits, the queue limit (429), shutting down (503),
// and text that is always valid UTF-8 even when the model emits lone byte tokens.
#include "folio/server/server.h"

#include <gtest/gtest.h>

#include <thread>

#include <fmt/format.h>

#include "folio/engine/text_decoder.h"
#include "server_test_util.h"

namespace folio::server {
namespace {

using testing::client;
using testing::expect_error;
using testing::get;
using testing::HttpAnswer;
using testing::Json;
using testing::post;

// One real tiny model and one server for the read-only tests of this file.
class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_engine_ = testing::start_tiny_model_engine().release();
    ServerOptions options;
    options.max_body_bytes = 64 << 10;
    server_ = testing::start_server(serve_model_engine(*model_engine_, "tiny"), options, &port_)
                  .release();
  }
  static void TearDownTestSuite() {
    server_->shutdown();
    delete server_;
    model_engine_->engine().stop();
    delete model_engine_;
  }

  // The text the engine itself produces for a prompt, greedy, without the server.
  static std::string engine_text(std::vector<int32_t> prompt, int32_t max_tokens) {
    return testing::engine_greedy_text(model_engine_->engine(), std::move(prompt), max_tokens);
  }

  static inline engine::ModelEngine* model_engine_ = nullptr;
  static inline Server* server_ = nullptr;
  static inline int port_ = 0;
};

TEST_F(ServerTest, HealthModelsAndMetricsAnswer) {
  const HttpAnswer health = get(port_, "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.json()["status"], "ok");
  const HttpAnswer models = get(port_, "/v1/models");
  ASSERT_EQ(models.status, 200);
  ASSERT_EQ(models.json()["data"].size(), 1u);
  EXPECT_EQ(models.json()["data"][0]["id"], "tiny");
  EXPECT_TRUE(models.json()["data"][0]["parent"].is_null());
  const HttpAnswer metrics = get(port_, "/metrics");
  ASSERT_EQ(metrics.status, 200);
  for (const char* family :
       {"folio_server_requests_total", "folio_server_requests_in_flight",
        "folio_server_request_duration_seconds", "folio_server_graph_hit_rate",
        "folio_engine_requests", "folio_engine_kv_blocks", "folio_pool_bytes_in_use",
        "folio_engine_prefix_cache_hit_rate", "folio_engine_preemptions_total",
        "folio_engine_time_to_first_token_seconds", "folio_engine_time_per_output_token_seconds",
        "folio_engine_prompt_tokens_total", "folio_engine_generated_tokens_total"}) {
    EXPECT_NE(metrics.body.find(std::string("# TYPE ") + family + " "), std::string::npos)
        << family;
  }
  EXPECT_GE(
      testing::metric_value(get(port_, "/metrics").body,
                            "folio_server_requests_total{endpoint=\"/health\",status=\"200\"}")
          .value_or(0),
      1);
}

TEST_F(ServerTest, CompletionMatchesTheEngineAndCountsUsage) {
  const std::string prompt = "The lighthouse";
  const HttpAnswer answer = post(
      port_, "/v1/completions",
      Json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}}.dump());
  ASSERT_EQ(answer.status, 200) << answer.body;
  const Json body = answer.json();
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "tiny");
  const std::vector<int32_t> tokens = model_engine_->model().tokenizer().encode(prompt);
  EXPECT_EQ(body["usage"]["prompt_tokens"], tokens.size());
  const int completion_tokens = body["usage"]["completion_tokens"];
  EXPECT_GE(completion_tokens, 1);
  EXPECT_LE(completion_tokens, 12);
  EXPECT_EQ(body["usage"]["total_tokens"], tokens.size() + completion_tokens);
  EXPECT_EQ(body["choices"][0]["text"], engine_text(tokens, 12));
  const std::string reason = body["choices"][0]["finish_reason"];
  EXPECT_EQ(reason, completion_tokens == 12 ? "length" : "stop");
}

TEST_F(ServerTest, ChatRendersTheDefaultTemplate) {
  const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "Hello"}};
  const HttpAnswer answer =
      post(port_, "/v1/chat/completions",
           Json{{"model", "tiny"},
                {"messages", Json::array({{{"role", "system"}, {"content", "Be brief."}},
                                          {{"role", "user"}, {"content", "Hello"}}})},
                {"max_tokens", 6},
                {"temperature", 0}}
               .dump());
  ASSERT_EQ(answer.status, 200) << answer.body;
  const Json body = answer.json();
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(server_->chat_template(), ChatTemplate::kChatMl);  // the model has no template
  tokenizer::EncodeOptions options;
  options.parse_special = true;
  const std::vector<int32_t> tokens = model_engine_->model().tokenizer().encode(
      render_chat(ChatTemplate::kChatMl, messages), options);
  EXPECT_EQ(body["usage"]["prompt_tokens"], tokens.size());
  EXPECT_EQ(body["choices"][0]["message"]["content"], engine_text(tokens, 6));
}

TEST_F(ServerTest, StreamedCompletionEqualsTheWholeAnswer) {
  Json request{{"model", "tiny"}, {"prompt", "Once upon"}, {"max_tokens", 20}, {"temperature", 0}};
  const HttpAnswer whole = post(port_, "/v1/completions", request.dump());
  ASSERT_EQ(whole.status, 200);
  request["stream"] = true;
  request["stream_options"] = {{"include_usage", true}};
  const HttpAnswer streamed = post(port_, "/v1/completions", request.dump());
  ASSERT_EQ(streamed.status, 200);
  std::string finish_reason;
  EXPECT_EQ(testing::streamed_text(streamed.body, &finish_reason),
            whole.json()["choices"][0]["text"]);
  EXPECT_EQ(finish_reason, whole.json()["choices"][0]["finish_reason"]);
  const std::vector<std::string> payloads = testing::sse_payloads(streamed.body);
  ASSERT_GE(payloads.size(), 3u);
  const Json usage = Json::parse(payloads[payloads.size() - 2]);
  EXPECT_EQ(usage["usage"], whole.json()["usage"]);
}

TEST_F(ServerTest, BadInputGets400WithAnOpenAiErrorBody) {
  const std::string long_prompt(4000, 'x');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/v1/completions", "{not json"},
      {"/v1/completions", R"(["array"])"},
      {"/v1/completions", R"({"model": "tiny", "prompt": 5})"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": -3})"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 100000000})"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 255})"},
      {"/v1/completions", Json{{"model", "tiny"}, {"prompt", long_prompt}}.dump()},
      {"/v1/completions", R"({"model": "tiny", "prompt": [1, 2, 999999]})"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "n": 17})"},
      {"/v1/completions", R"({"model": "tiny", "prompt": "x", "frobnicate": true})"},
      {"/v1/chat/completions", R"({"model": "tiny", "messages": []})"},
      {"/v1/chat/completions", R"({"model": "tiny", "messages": [{"role": "user"}]})"},
      {"/v1/chat/completions",
       R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": [{}]})"},
  };
  for (const auto& [path, body] : cases) {
    SCOPED_TRACE(body.substr(0, 120));
    expect_error(post(port_, path, body), 400, kInvalidRequestError);
  }
  // An unknown model is a 404, as OpenAI answers it, naming the model.
  const HttpAnswer unknown = post(port_, "/v1/completions", R"({"model": "other", "prompt": "x"})");
  expect_error(unknown, 404, kInvalidRequestError);
  EXPECT_EQ(unknown.json()["error"]["code"], "model_not_found");
  EXPECT_NE(unknown.json()["error"]["message"].get<std::string>().find("'other'"),
            std::string::npos);
  // The server still serves after all of that.
  EXPECT_EQ(
      post(port_, "/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 2})").status,
      200);
}

TEST_F(ServerTest, UnknownRoutesAndOversizedBodiesGetErrorBodies) {
  expect_error(get(port_, "/v2/nothing"), 404, kInvalidRequestError);
  const std::string huge = Json{{"model", "tiny"}, {"prompt", std::string(100 << 10, 'a')}}.dump();
  const HttpAnswer answer = post(port_, "/v1/completions", huge);
  EXPECT_EQ(answer.status, 413) << answer.body;
  EXPECT_EQ(get(port_, "/health").status, 200);
}

TEST(ServerAuthTest, ApiKeyIsRequiredOnV1RoutesOnly) {
  testing::ToyServedEngine toy;
  ServerOptions options;
  options.api_key = "sesame";
  int port = 0;
  std::unique_ptr<Server> server = testing::start_server(toy.served(), options, &port);
  const std::string body = R"({"model": "toy", "prompt": "hi", "max_tokens": 2})";
  const HttpAnswer missing = post(port, "/v1/completions", body);
  EXPECT_EQ(missing.status, 401);
  EXPECT_EQ(missing.json()["error"]["code"], "invalid_api_key");
  EXPECT_EQ(post(port, "/v1/completions", body, {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(get(port, "/v1/models").status, 401);
  EXPECT_EQ(post(port, "/v1/completions", body, {{"Authorization", "Bearer sesame"}}).status, 200);
  EXPECT_EQ(get(port, "/health").status, 200);
  server->shutdown();
}

TEST(ServerLimitsTest, AFullQueueGets429AndShuttingDownGets503) {
  testing::ToyServedEngine toy;
  ServerOptions options;
  options.max_pending_requests = 2;
  int port = 0;
  std::unique_ptr<Server> server = testing::start_server(toy.served(), options, &port);
  toy.set_gate(false);  // every step waits: admitted requests stay in flight
  const std::string body = R"({"model": "toy", "prompt": "hi", "max_tokens": 3})";
  std::vector<std::thread> holders;
  std::vector<int> holder_status(2);
  for (int index = 0; index < 2; ++index) {
    holders.emplace_back(
        [&, index] { holder_status[index] = post(port, "/v1/completions", body).status; });
  }
  while (server->num_in_flight() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const HttpAnswer refused = post(port, "/v1/completions", body);
  EXPECT_EQ(refused.status, 429);
  EXPECT_EQ(refused.json()["error"]["type"], kRateLimitError);
  // Shutting down: new requests get 503 while the two in flight still finish.
  std::thread stopper([&] { server->shutdown(std::chrono::seconds(30)); });
  HttpAnswer during;
  for (int attempt = 0; attempt < 2000 && during.status != 503; ++attempt) {
    during = post(port, "/v1/completions", body);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(during.status, 503);
  toy.set_gate(true);
  for (std::thread& holder : holders) holder.join();
  stopper.join();
  EXPECT_EQ(holder_status, (std::vector<int>{200, 200}));
}

// A runner that makes the greedy choice at generated position i be script[i], for prompts of
// `prompt_length` tokens; it ignores the KV cache.
class ScriptedStepRunner final : public engine::StepRunner {
 public:
  ScriptedStepRunner(int32_t vocab_size, int32_t prompt_length, std::vector<int32_t> script)
      : vocab_size_(vocab_size), prompt_length_(prompt_length), script_(std::move(script)) {}

  Result<ir::StepOutput> run(const ir::StepBatch& step) override {
    logits_.assign(step.logit_indices.size() * static_cast<size_t>(vocab_size_), 0.0f);
    size_t row = 0;
    for (int32_t segment = 0; segment < step.num_sequences(); ++segment) {
      const int32_t last_token = step.query_start[segment + 1] - 1;
      if (row >= step.logit_indices.size() || step.logit_indices[row] != last_token) continue;
      const int32_t generated = step.seq_lens[segment] - prompt_length_;
      const int32_t token = script_[static_cast<size_t>(generated) % script_.size()];
      logits_[row * static_cast<size_t>(vocab_size_) + static_cast<size_t>(token)] = 1.0f;
      ++row;
    }
    return ir::StepOutput{logits_, step.num_logit_rows(), vocab_size_, {}, 0};
  }
  int32_t vocab_size() const override { return vocab_size_; }

 private:
  int32_t vocab_size_;
  int32_t prompt_length_;
  std::vector<int32_t> script_;
  std::vector<float> logits_;
};

TEST(ServerUtf8Test, LoneByteTokensBecomeReplacementCharactersNeverErrors) {
  const tokenizer::Tokenizer tokenizer = testing::make_tiny_model()->tokenizer();
  auto byte_token = [&](int byte) {
    const std::optional<tokenizer::TokenId> id =
        tokenizer.find_piece(fmt::format("<0x{:02X}>", byte));
    EXPECT_TRUE(id.has_value()) << byte;
    return static_cast<int32_t>(id.value_or(0));
  };
  // "A", then € split over three byte tokens, a lead byte cut off by "B", a lone continuation
  // byte, and a lead byte still open when generation ends.
  const std::vector<int32_t> script = {byte_token('A'),  byte_token(0xE2), byte_token(0x82),
                                       byte_token(0xAC), byte_token(0xC3), byte_token('B'),
                                       byte_token(0x80), byte_token(0xF0)};
  const std::vector<int32_t> prompt = {byte_token('h'), byte_token('i'), byte_token('!')};
  testing::ToyServedEngine scripted(std::make_unique<ScriptedStepRunner>(
      static_cast<int32_t>(tokenizer.vocab_size()), static_cast<int32_t>(prompt.size()), script));
  int port = 0;
  std::unique_ptr<Server> server = testing::start_server(scripted.served(), {}, &port);
  const std::string replacement = "\xEF\xBF\xBD";
  const std::string expected = "A\xE2\x82\xAC" + replacement + "B" + replacement + replacement;
  Json request{{"model", "toy"},
               {"prompt", prompt},
               {"max_tokens", static_cast<int>(script.size())},
               {"temperature", 0}};
  const HttpAnswer whole = post(port, "/v1/completions", request.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(whole.json()["choices"][0]["text"], expected);
  EXPECT_EQ(whole.json()["usage"]["completion_tokens"], script.size());
  request["stream"] = true;
  const HttpAnswer streamed = post(port, "/v1/completions", request.dump());
  ASSERT_EQ(streamed.status, 200);
  EXPECT_EQ(testing::streamed_text(streamed.body), expected);
  // Every chunk on its own is valid UTF-8 (a split character is never sent in halves).
  for (const std::string& payload : testing::sse_payloads(streamed.body)) {
    EXPECT_EQ(engine::replace_invalid_utf8(payload), payload);
  }
  server->shutdown();
}

}  // namespace
}  // namespace folio::server

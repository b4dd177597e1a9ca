// The load generator against StandInServer, a real local HTTP server that streams known chunks
// (a test fixture standing in for `folio serve`). Timing checks are lower bounds the stand-in's
// sleeps guarantee, never upper bounds.
#include "bench/server/load_runner.h"

#include <gtest/gtest.h>

#include <set>

#include <nlohmann/json.hpp>

#include "bench/server/load_summary.h"
#include "bench/server/stand_in_server.h"

namespace folio::bench {
namespace {

using testing::StandInMode;
using testing::StandInServer;

LoadOptions short_load(const StandInServer& server) {
  LoadOptions options;
  options.url = server.url();
  options.num_clients = 3;
  options.duration_seconds = 0.2;
  options.drain_timeout_seconds = 10;
  options.max_tokens = 6;
  options.prompt_words_min = 2;
  options.prompt_words_max = 9;
  return options;
}

void expect_every_outcome(const LoadRun& run, RequestOutcome expected) {
  ASSERT_FALSE(run.records.empty());
  for (const RequestRecord& record : run.records) {
    EXPECT_EQ(record.outcome, expected) << outcome_name(record.outcome) << ": " << record.error;
  }
}

TEST(LoadRunnerTest, MeasuresStreamsAndCountsWhatTheServerServed) {
  StandInServer server("", std::chrono::milliseconds(5), std::chrono::milliseconds(1));
  const Result<LoadRun> run = run_load(short_load(server));
  ASSERT_TRUE(run.ok()) << run.status();
  expect_every_outcome(*run, RequestOutcome::kSucceeded);
  EXPECT_EQ(run->options.model, "stand-in");  // found through /v1/models
  // Every request the server saw is a counted record (no warm-up here), none was lost.
  EXPECT_EQ(static_cast<int64_t>(run->records.size()), server.num_generation_requests());
  EXPECT_EQ(server.num_bad_requests(), 0);
  EXPECT_EQ(server.num_usage_requests(), server.num_generation_requests());
  for (const RequestRecord& record : run->records) {
    EXPECT_EQ(record.num_text_chunks, 6);
    EXPECT_EQ(record.output_tokens(), 6);
    EXPECT_EQ(record.inter_token_gaps_seconds.size(), 5u);
    EXPECT_GE(record.start, run->window_start);
    EXPECT_LT(record.start, run->window_end);
    EXPECT_LE(record.end, run->last_end);
    // The stand-in sleeps 5 ms before the first chunk and 1 ms between chunks.
    EXPECT_GE(record.time_to_first_token_seconds(), 0.005);
    EXPECT_GE(record.end_to_end_seconds(), 0.005 + 5 * 0.001);
  }
  const LoadSummary summary = summarize(*run);
  EXPECT_EQ(summary.num_requests_by_outcome[0], static_cast<int64_t>(run->records.size()));
  EXPECT_EQ(summary.num_failed, 0);
  EXPECT_EQ(summary.output_tokens, 6 * static_cast<int64_t>(run->records.size()));
  EXPECT_EQ(summary.ttft_ms.count, static_cast<int64_t>(run->records.size()));
  EXPECT_GE(summary.ttft_ms.p50, 5.0);
  EXPECT_GT(summary.output_tokens_per_second, 0);
}

TEST(LoadRunnerTest, ChatWithoutUsageCountsContentDeltas) {
  StandInServer server;
  LoadOptions options = short_load(server);
  options.endpoint = Endpoint::kChat;
  options.request_usage = false;
  options.num_clients = 2;
  const Result<LoadRun> run = run_load(options);
  ASSERT_TRUE(run.ok()) << run.status();
  expect_every_outcome(*run, RequestOutcome::kSucceeded);
  EXPECT_EQ(server.num_bad_requests(), 0);
  EXPECT_EQ(server.num_usage_requests(), 0);
  for (const RequestRecord& record : run->records) {
    EXPECT_FALSE(record.usage_completion_tokens.has_value());
    EXPECT_EQ(record.output_tokens(), 6);  // the role-only delta is not a token
  }
}

TEST(LoadRunnerTest, SendsTheApiKey) {
  StandInServer server("secret");
  LoadOptions options = short_load(server);
  const Result<std::string> refused = fetch_model_id(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--api-key"), std::string::npos) << refused.status();
  EXPECT_FALSE(run_load(options).ok());
  EXPECT_EQ(server.num_generation_requests(), 0);  // no load is sent when the check fails

  options.api_key = "secret";
  const Result<LoadRun> run = run_load(options);
  ASSERT_TRUE(run.ok()) << run.status();
  expect_every_outcome(*run, RequestOutcome::kSucceeded);
}

TEST(LoadRunnerTest, CountsEachKindOfFailureApart) {
  const std::vector<std::pair<StandInMode, RequestOutcome>> cases = {
      {StandInMode::kHttpError, RequestOutcome::kHttpError},
      {StandInMode::kMalformed, RequestOutcome::kMalformedStream},
      {StandInMode::kNoDone, RequestOutcome::kMissingDone},
      {StandInMode::kErrorEvent, RequestOutcome::kErrorEvent},
  };
  for (const auto& [mode, outcome] : cases) {
    SCOPED_TRACE(std::string(outcome_name(outcome)));
    StandInServer server;
    server.set_mode(mode);
    LoadOptions options = short_load(server);
    options.duration_seconds = 0.1;
    const Result<LoadRun> run = run_load(options);
    ASSERT_TRUE(run.ok()) << run.status();
    expect_every_outcome(*run, outcome);
    const LoadSummary summary = summarize(*run);
    EXPECT_EQ(summary.num_failed, static_cast<int64_t>(run->records.size()));
    EXPECT_EQ(summary.num_requests_by_outcome[static_cast<size_t>(outcome)], summary.num_failed);
    EXPECT_FALSE(summary.first_error.empty());
    EXPECT_EQ(summary.output_tokens, 0);
    EXPECT_EQ(summary.ttft_ms.count, 0);
  }
}

TEST(LoadRunnerTest, DrainDeadlineCutsOffStalledStreams) {
  StandInServer server;
  server.set_mode(StandInMode::kStall);
  LoadOptions options = short_load(server);
  options.num_clients = 2;
  options.duration_seconds = 0.05;
  options.drain_timeout_seconds = 0.15;
  const Result<LoadRun> run = run_load(options);
  ASSERT_TRUE(run.ok()) << run.status();
  // Each client's first request never ends on its own, so it is the only one it sends.
  ASSERT_EQ(run->records.size(), 2u);
  expect_every_outcome(*run, RequestOutcome::kCancelled);
  for (const RequestRecord& record : run->records) EXPECT_GE(record.end, run->window_end);
}

TEST(LoadRunnerTest, WarmupRequestsAreNotCounted) {
  StandInServer server;
  LoadOptions options = short_load(server);
  options.num_clients = 1;
  options.warmup_seconds = 0.1;
  options.duration_seconds = 0.1;
  const Result<LoadRun> run = run_load(options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_GE(run->num_warmup_requests, 1);  // the first request starts at once, inside warm-up
  EXPECT_EQ(run->num_warmup_requests + static_cast<int64_t>(run->records.size()),
            server.num_generation_requests());
  for (const RequestRecord& record : run->records) EXPECT_GE(record.start, run->window_start);
}

TEST(LoadRunnerTest, UnreachableServerIsAnErrorBeforeAnyLoad) {
  std::string url;
  {
    StandInServer gone;
    url = gone.url();
  }
  LoadOptions options;
  options.url = url;
  const Result<LoadRun> run = run_load(options);
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("is the server running"), std::string::npos)
      << run.status();
}

TEST(LoadRunnerTest, RejectsOptionsOutOfRange) {
  const auto rejects = [](auto change, const char* flag) {
    LoadOptions options;
    change(options);
    const Status status = validate(options);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << flag;
    EXPECT_NE(status.message().find(flag), std::string::npos) << status;
  };
  rejects([](LoadOptions& o) { o.num_clients = 0; }, "--clients");
  rejects([](LoadOptions& o) { o.duration_seconds = 0; }, "--duration");
  rejects([](LoadOptions& o) { o.warmup_seconds = -1; }, "--warmup");
  rejects([](LoadOptions& o) { o.request_timeout_seconds = 0; }, "--request-timeout");
  rejects([](LoadOptions& o) { o.max_tokens = 0; }, "--max-tokens");
  rejects([](LoadOptions& o) { o.prompt_words_min = 0; }, "--prompt-len");
  rejects([](LoadOptions& o) { o.prompt_words_max = o.prompt_words_min - 1; }, "--prompt-len");
  EXPECT_TRUE(validate(LoadOptions()).ok());
}

TEST(PromptGeneratorTest, SeededPromptsRepeatAndStayInRange) {
  PromptGenerator first(42, 3, 7), again(42, 3, 7), other(43, 3, 7);
  std::set<size_t> lengths;
  bool differs = false;
  for (int i = 0; i < 200; ++i) {
    const std::string prompt = first.next();
    EXPECT_EQ(prompt, again.next());
    differs |= prompt != other.next();
    const size_t words = 1 + static_cast<size_t>(std::count(prompt.begin(), prompt.end(), ' '));
    EXPECT_GE(words, 3u);
    EXPECT_LE(words, 7u);
    lengths.insert(words);
  }
  EXPECT_TRUE(differs);
  EXPECT_EQ(lengths.size(), 5u);  // every length from 3 to 7 occurs
}

TEST(RequestBodyTest, HasTheShapeOfEachEndpoint) {
  LoadOptions options;
  options.model = "m";
  options.max_tokens = 12;
  options.ignore_eos = true;
  const nlohmann::json completion = nlohmann::json::parse(make_request_body(options, "a b"));
  EXPECT_EQ(completion["prompt"], "a b");
  EXPECT_EQ(completion["model"], "m");
  EXPECT_EQ(completion["max_tokens"], 12);
  EXPECT_EQ(completion["stream"], true);
  EXPECT_EQ(completion["stream_options"]["include_usage"], true);
  EXPECT_EQ(completion["ignore_eos"], true);

  options.endpoint = Endpoint::kChat;
  options.request_usage = false;
  options.ignore_eos = false;
  const nlohmann::json chat = nlohmann::json::parse(make_request_body(options, "a b"));
  EXPECT_EQ(chat["messages"], nlohmann::json::parse(R"([{"role":"user","content":"a b"}])"));
  EXPECT_FALSE(chat.contains("prompt"));
  EXPECT_FALSE(chat.contains("stream_options"));
  EXPECT_FALSE(chat.contains("ignore_eos"));
}

}  // namespace
}  // namespace folio::bench

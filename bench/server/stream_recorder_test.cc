#include "bench/server/stream_recorder.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace folio::bench {
namespace {

using std::chrono::milliseconds;

const Clock::time_point kStart = Clock::time_point() + std::chrono::hours(1);

std::string completion_chunk(const std::string& text) {
  return "data: {\"choices\":[{\"index\":0,\"text\":\"" + text + "\"}]}\n\n";
}

std::string chat_chunk(const std::string& content_json) {
  return "data: {\"choices\":[{\"index\":0,\"delta\":" + content_json + "}]}\n\n";
}

double ms(double seconds) {
  return seconds * 1e3;
}

TEST(StreamRecorderTest, MeasuresTtftGapsAndTpotFromArrivalTimes) {
  StreamRecorder recorder(Endpoint::kCompletions, kStart);
  recorder.on_response(200, "text/event-stream; charset=utf-8");
  EXPECT_TRUE(recorder.on_body(completion_chunk("Once"), kStart + milliseconds(40)));
  EXPECT_TRUE(recorder.on_body(completion_chunk(""), kStart + milliseconds(45)));  // no text
  EXPECT_TRUE(recorder.on_body(completion_chunk(" upon"), kStart + milliseconds(50)));
  EXPECT_TRUE(recorder.on_body(completion_chunk(" a") + completion_chunk(" time"),
                               kStart + milliseconds(70)));
  EXPECT_TRUE(recorder.on_body("data: [DONE]\n\n", kStart + milliseconds(71)));
  const RequestRecord record = recorder.finish(kStart + milliseconds(72), std::nullopt, false);

  EXPECT_EQ(record.outcome, RequestOutcome::kSucceeded) << record.error;
  EXPECT_EQ(record.http_status, 200);
  EXPECT_EQ(record.num_text_chunks, 4);
  EXPECT_EQ(record.output_tokens(), 4);
  EXPECT_DOUBLE_EQ(ms(record.time_to_first_token_seconds()), 40);
  ASSERT_EQ(record.inter_token_gaps_seconds.size(), 3u);
  EXPECT_DOUBLE_EQ(ms(record.inter_token_gaps_seconds[0]), 10);
  EXPECT_DOUBLE_EQ(ms(record.inter_token_gaps_seconds[1]), 20);
  EXPECT_DOUBLE_EQ(ms(record.inter_token_gaps_seconds[2]), 0);  // same read: same arrival
  EXPECT_DOUBLE_EQ(ms(*record.time_per_output_token_seconds()), 30.0 / 3);
  EXPECT_DOUBLE_EQ(ms(record.end_to_end_seconds()), 72);
}

TEST(StreamRecorderTest, UsageChunkGivesTheTokenCount) {
  StreamRecorder recorder(Endpoint::kCompletions, kStart);
  recorder.on_response(200, "text/event-stream");
  // Two chunks carrying three tokens each, then the usage chunk (no choices) the server sends
  // for stream_options.include_usage.
  recorder.on_body(completion_chunk("a b c"), kStart + milliseconds(10));
  recorder.on_body(completion_chunk(" d e f"), kStart + milliseconds(25));
  recorder.on_body(
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":6}}\n\n"
      "data: [DONE]\n\n",
      kStart + milliseconds(26));
  const RequestRecord record = recorder.finish(kStart + milliseconds(26), std::nullopt, false);
  EXPECT_EQ(record.outcome, RequestOutcome::kSucceeded) << record.error;
  EXPECT_EQ(record.num_text_chunks, 2);
  EXPECT_EQ(record.output_tokens(), 6);
  EXPECT_DOUBLE_EQ(ms(*record.time_per_output_token_seconds()), 15.0 / 5);
}

TEST(StreamRecorderTest, ChatDeltasCountOnlyContent) {
  StreamRecorder recorder(Endpoint::kChat, kStart);
  recorder.on_response(200, "text/event-stream");
  recorder.on_body(chat_chunk(R"({"role":"assistant"})"), kStart + milliseconds(5));
  recorder.on_body(chat_chunk(R"({"content":null})"), kStart + milliseconds(6));
  recorder.on_body(chat_chunk(R"({"content":"Hi"})"), kStart + milliseconds(20));
  recorder.on_body(chat_chunk(R"({})") + "data: [DONE]\n\n", kStart + milliseconds(30));
  const RequestRecord record = recorder.finish(kStart + milliseconds(30), std::nullopt, false);
  EXPECT_EQ(record.outcome, RequestOutcome::kSucceeded) << record.error;
  EXPECT_EQ(record.num_text_chunks, 1);
  EXPECT_DOUBLE_EQ(ms(record.time_to_first_token_seconds()), 20);
  EXPECT_FALSE(record.time_per_output_token_seconds().has_value());  // one token: no TPOT
}

TEST(StreamRecorderTest, ChunkSplitAcrossReadsIsTimedAtItsLastByte) {
  StreamRecorder recorder(Endpoint::kCompletions, kStart);
  recorder.on_response(200, "text/event-stream");
  const std::string chunk = completion_chunk("x");
  recorder.on_body(chunk.substr(0, 9), kStart + milliseconds(10));
  recorder.on_body(chunk.substr(9), kStart + milliseconds(15));
  recorder.on_body("data: [DONE]\n\n", kStart + milliseconds(16));
  const RequestRecord record = recorder.finish(kStart + milliseconds(16), std::nullopt, false);
  EXPECT_DOUBLE_EQ(ms(record.time_to_first_token_seconds()), 15);
}

struct FailureCase {
  const char* name;
  int status;
  const char* content_type;
  std::string body;
  std::optional<std::string> transport_error;
  RequestOutcome expected;
  const char* error_contains;
};

TEST(StreamRecorderTest, ClassifiesEachKindOfFailure) {
  const std::string done = "data: [DONE]\n\n";
  const std::vector<FailureCase> cases = {
      {"http 500", 500, "application/json", R"({"error":{"message":"model not loaded"}})",
       std::nullopt, RequestOutcome::kHttpError, "model not loaded"},
      {"not an event stream", 200, "application/json", "{}", std::nullopt,
       RequestOutcome::kMalformedStream, "text/event-stream"},
      {"data not JSON", 200, "text/event-stream", "data: {oops\n\n" + done, std::nullopt,
       RequestOutcome::kMalformedStream, "not a JSON object"},
      {"chunk of the other endpoint", 200, "text/event-stream",
       chat_chunk(R"({"content":"a"})") + done, std::nullopt, RequestOutcome::kMalformedStream,
       "completions"},
      {"event after done", 200, "text/event-stream", done + completion_chunk("late"), std::nullopt,
       RequestOutcome::kMalformedStream, "after [DONE]"},
      {"error event", 200, "text/event-stream",
       completion_chunk("a") + R"(data: {"error":{"message":"out of memory"}})"
                               "\n\n",
       std::nullopt, RequestOutcome::kErrorEvent, "out of memory"},
      {"no done", 200, "text/event-stream", completion_chunk("a"), std::nullopt,
       RequestOutcome::kMissingDone, "without data: [DONE]"},
      {"broken inside an event", 200, "text/event-stream", "data: {\"cho",
       std::string("Connection reset"), RequestOutcome::kMissingDone, "inside an event"},
  };
  for (const FailureCase& c : cases) {
    StreamRecorder recorder(Endpoint::kCompletions, kStart);
    recorder.on_response(c.status, c.content_type);
    recorder.on_body(c.body, kStart + milliseconds(1));
    const RequestRecord record =
        recorder.finish(kStart + milliseconds(2), c.transport_error, false);
    EXPECT_EQ(record.outcome, c.expected) << c.name << ": " << record.error;
    EXPECT_NE(record.error.find(c.error_contains), std::string::npos)
        << c.name << ": '" << record.error << "'";
    EXPECT_EQ(record.http_status, c.status) << c.name;
  }
}

TEST(StreamRecorderTest, StopsReadingAMalformedStream) {
  StreamRecorder recorder(Endpoint::kCompletions, kStart);
  recorder.on_response(200, "text/event-stream");
  EXPECT_FALSE(recorder.on_body("data: not json\n\n", kStart));
  EXPECT_FALSE(recorder.on_body(completion_chunk("a"), kStart));
  const RequestRecord record =
      recorder.finish(kStart, std::string("Canceled"), /*cancelled=*/false);
  EXPECT_EQ(record.outcome, RequestOutcome::kMalformedStream);  // the cause, not the cut-off
  EXPECT_EQ(record.num_text_chunks, 0);
}

TEST(StreamRecorderTest, NoResponseIsAConnectionFailureAndCutOffIsCancelled) {
  StreamRecorder refused(Endpoint::kCompletions, kStart);
  const RequestRecord record = refused.finish(kStart, std::string("Connection"), false);
  EXPECT_EQ(record.outcome, RequestOutcome::kConnectionFailed);
  EXPECT_EQ(record.error, "Connection");
  EXPECT_EQ(record.http_status, 0);

  StreamRecorder cut(Endpoint::kCompletions, kStart);
  cut.on_response(200, "text/event-stream");
  cut.on_body(completion_chunk("a"), kStart);
  EXPECT_EQ(cut.finish(kStart, std::string("Canceled"), true).outcome, RequestOutcome::kCancelled);
}

TEST(StreamRecorderTest, OutcomeNamesAreDistinct) {
  std::set<std::string_view> names;
  for (int i = 0; i < kNumRequestOutcomes; ++i) {
    names.insert(outcome_name(static_cast<RequestOutcome>(i)));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumRequestOutcomes));
}

}  // namespace
}  // namespace folio::bench

#include "bench/server/sse_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace folio::bench {
namespace {

struct Parsed {
  std::vector<SseEvent> events;
  bool at_boundary = false;
};

// Feeds `stream` in pieces that end at the given cut positions (ascending, inside the stream).
Parsed parse_in_pieces(std::string_view stream, const std::vector<size_t>& cuts) {
  SseParser parser;
  Parsed parsed;
  size_t begin = 0;
  auto feed = [&](size_t end) {
    const Status status = parser.feed(stream.substr(begin, end - begin),
                                      [&](const SseEvent& e) { parsed.events.push_back(e); });
    EXPECT_TRUE(status.ok()) << status;
    begin = end;
  };
  for (const size_t cut : cuts) feed(cut);
  feed(stream.size());
  parsed.at_boundary = parser.at_boundary();
  return parsed;
}

Parsed parse_whole(std::string_view stream) {
  return parse_in_pieces(stream, {});
}

// An independent reference: normalizes every line ending of the complete stream to LF first, so
// it has no state to carry between pieces, then applies the specification's field rules.
std::vector<SseEvent> reference_parse(const std::string& stream) {
  std::string text;
  for (size_t i = 0; i < stream.size(); ++i) {
    if (stream[i] == '\r') {
      text.push_back('\n');
      if (i + 1 < stream.size() && stream[i + 1] == '\n') ++i;
    } else {
      text.push_back(stream[i]);
    }
  }
  std::vector<SseEvent> events;
  SseEvent event;
  bool has_data = false;
  size_t start = 0;
  for (size_t newline = text.find('\n'); newline != std::string::npos;
       start = newline + 1, newline = text.find('\n', start)) {
    const std::string line = text.substr(start, newline - start);
    if (line.empty()) {
      if (has_data) events.push_back(event);
      event = SseEvent();
      has_data = false;
    } else if (line[0] != ':') {
      const size_t colon = line.find(':');
      const std::string field = line.substr(0, colon);
      std::string value = colon == std::string::npos ? "" : line.substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.erase(0, 1);
      if (field == "data") {
        event.data += (has_data ? "\n" : "") + value;
        has_data = true;
      } else if (field == "event") {
        event.type = value;
      } else if (field == "id") {
        event.id = value;
      }
    }
  }
  return events;
}

TEST(SseParserTest, ParsesTheEventsOfAnOpenAiStream) {
  const std::string stream =
      "data: {\"choices\":[{\"text\":\"Hello\"}]}\n\n"
      "data: {\"choices\":[{\"text\":\" world\"}]}\n\n"
      "data: [DONE]\n\n";
  const Parsed parsed = parse_whole(stream);
  ASSERT_EQ(parsed.events.size(), 3u);
  EXPECT_EQ(parsed.events[0].data, "{\"choices\":[{\"text\":\"Hello\"}]}");
  EXPECT_EQ(parsed.events[0].type, "message");
  EXPECT_EQ(parsed.events[2].data, "[DONE]");
  EXPECT_TRUE(parsed.at_boundary);
}

TEST(SseParserTest, AppliesTheFieldRules) {
  const Parsed parsed = parse_whole(
      ": a comment, ignored\n"
      "event: delta\nid: 7\ndata: first\ndata:second\ndata:  two spaces\nretry: 10\n\n"
      "data\n\n"           // a field without a colon: an empty data line
      "event: lonely\n\n"  // no data: not dispatched
      "data: after\n\n");
  ASSERT_EQ(parsed.events.size(), 3u);
  EXPECT_EQ(parsed.events[0].type, "delta");
  EXPECT_EQ(parsed.events[0].id, "7");
  EXPECT_EQ(parsed.events[0].data, "first\nsecond\n two spaces");
  EXPECT_EQ(parsed.events[1].data, "");
  EXPECT_EQ(parsed.events[2].type, "message");  // the undispatched event's type does not leak
  EXPECT_EQ(parsed.events[2].data, "after");
}

TEST(SseParserTest, AcceptsEveryLineEnding) {
  for (const std::string ending : {"\n", "\r\n", "\r"}) {
    const Parsed parsed = parse_whole("data: a" + ending + "data: b" + ending + ending);
    ASSERT_EQ(parsed.events.size(), 1u) << "ending size " << ending.size();
    EXPECT_EQ(parsed.events[0].data, "a\nb");
  }
}

TEST(SseParserTest, CrlfSplitBetweenCallsIsOneLineEnding) {
  // "\r" | "\ndata: b": the LF completes the CRLF, it is not a blank line, so "a" and "b" are
  // one event; a lone CR followed by CR is a line end and a blank line.
  const Parsed joined = parse_in_pieces("data: a\r\ndata: b\n\n", {8});
  ASSERT_EQ(joined.events.size(), 1u);
  EXPECT_EQ(joined.events[0].data, "a\nb");
  EXPECT_EQ(parse_in_pieces("data: a\r\r", {8}).events.size(), 1u);
  const Parsed two = parse_in_pieces("data: a\r\n\r\ndata: b\r\n\r\n", {8, 10, 20});
  ASSERT_EQ(two.events.size(), 2u);
  EXPECT_EQ(two.events[1].data, "b");
}

TEST(SseParserTest, ReportsWhetherTheStreamEndedBetweenEvents) {
  EXPECT_TRUE(parse_whole("").at_boundary);
  EXPECT_TRUE(parse_whole("data: a\n\n").at_boundary);
  EXPECT_TRUE(parse_whole("data: a\r\n\r").at_boundary);    // ended on the CR of a CRLF
  EXPECT_FALSE(parse_whole("data: a\n").at_boundary);       // a field, no blank line
  EXPECT_FALSE(parse_whole("data: a\n\ndat").at_boundary);  // an unterminated line
  EXPECT_TRUE(parse_whole(": keep-alive\n").at_boundary);   // a comment sets no field
}

TEST(SseParserTest, OverlongLineFailsAndStaysFailed) {
  SseParser parser(/*max_line_bytes=*/16);
  int events = 0;
  auto count = [&](const SseEvent&) { ++events; };
  ASSERT_TRUE(parser.feed("data: 0123456789\n\n", count).ok());  // exactly 16 bytes: fine
  EXPECT_EQ(events, 1);
  EXPECT_TRUE(parser.feed("data: 01234", count).ok());
  const Status status = parser.feed("567890\n\n", count);  // the line grows to 17 bytes
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("16 bytes"), std::string::npos) << status;
  EXPECT_EQ(parser.feed("data: x\n\n", count).code(), StatusCode::kDataLoss);
  EXPECT_EQ(events, 1);
}

// A random stream of events: random fields, line endings, comments and multi-byte UTF-8 text.
std::string random_stream(std::mt19937_64& random) {
  const std::vector<std::string> endings = {"\n", "\r\n", "\r"};
  const std::vector<std::string> values = {
      "{\"choices\":[{\"text\":\"x\"}]}", "[DONE]", "", " leading space",
      "caf\xc3\xa9 \xe2\x82\xac",         "a:b:c"};
  auto pick = [&](const std::vector<std::string>& from) { return from[random() % from.size()]; };
  std::string stream;
  const int num_events = 1 + static_cast<int>(random() % 8);
  for (int e = 0; e < num_events; ++e) {
    const int num_lines = 1 + static_cast<int>(random() % 4);
    for (int l = 0; l < num_lines; ++l) {
      switch (random() % 5) {
        case 0:
          stream += ": comment " + pick(values);
          break;
        case 1:
          stream += "event: kind" + std::to_string(random() % 3);
          break;
        case 2:
          stream += "id: " + std::to_string(random() % 100);
          break;
        default:
          stream += (random() % 2 ? "data: " : "data:") + pick(values);
          break;
      }
      stream += pick(endings);
    }
    // The blank line. After a lone CR an LF would only complete a CRLF, not end the event.
    stream += stream.back() == '\r' ? std::string(random() % 2 ? "\r" : "\r\n") : pick(endings);
  }
  return stream;
}

TEST(SseParserTest, RandomSplitPointsGiveTheReferenceEvents) {
  std::mt19937_64 random(20261121);
  for (int trial = 0; trial < 400; ++trial) {
    const std::string stream = random_stream(random);
    const std::vector<SseEvent> expected = reference_parse(stream);
    std::vector<size_t> cuts;
    for (size_t i = 1; i < stream.size(); ++i) {
      if (random() % 4 == 0) cuts.push_back(i);
    }
    const Parsed parsed = parse_in_pieces(stream, cuts);
    ASSERT_EQ(parsed.events, expected) << "trial " << trial << ", stream '" << stream << "'";
    EXPECT_TRUE(parsed.at_boundary) << "trial " << trial;
  }
}

TEST(SseParserTest, OneByteAtATimeGivesTheReferenceEvents) {
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 50; ++trial) {
    const std::string stream = random_stream(random);
    std::vector<size_t> every_byte;
    for (size_t i = 1; i < stream.size(); ++i) every_byte.push_back(i);
    ASSERT_EQ(parse_in_pieces(stream, every_byte).events, reference_parse(stream))
        << "stream '" << stream << "'";
  }
}

}  // namespace
}  // namespace folio::bench

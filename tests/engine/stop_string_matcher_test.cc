// Stop strings on streamed text, and the text decoders (span and incremental): hand cases plus
// randomized streams checked against matching on the whole text.
#include "folio/engine/stop_string_matcher.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "folio/base/random.h"
#include "folio/engine/text_decoder.h"
#include "folio/tokenizer/spm_vocabulary_builder.h"
#include "folio/tokenizer/tokenizer.h"

namespace folio::engine {
namespace {

TEST(StopStringMatcherTest, HoldsBackAPossibleStartAndReleasesItWhenItDiverges) {
  StopStringMatcher matcher({"END"});
  EXPECT_EQ(matcher.push("abcE").released, "abc");
  EXPECT_EQ(matcher.push("N").released, "");
  const StopStringMatcher::Output diverged = matcher.push("x");
  EXPECT_EQ(diverged.released, "ENx");
  EXPECT_FALSE(diverged.matched_stop.has_value());
}

TEST(StopStringMatcherTest, MatchesAcrossDeltasAndDropsEverythingFromTheStopOn) {
  StopStringMatcher matcher({"xyz", "END"});
  EXPECT_EQ(matcher.push("hello E").released, "hello ");
  const StopStringMatcher::Output output = matcher.push("ND and more");
  EXPECT_EQ(output.released, "");
  EXPECT_EQ(output.matched_stop, 1u);
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.flush(), "");
}

TEST(StopStringMatcherTest, TheFirstStopToCompleteWinsWhateverTheDeltas) {
  // "cd" completes before "bcdx", though it starts later.
  for (const std::vector<std::string>& deltas :
       {std::vector<std::string>{"abcdx"}, std::vector<std::string>{"ab", "c", "dx"}}) {
    StopStringMatcher matcher({"bcdx", "cd"});
    std::string released;
    std::optional<size_t> matched;
    for (const std::string& delta : deltas) {
      StopStringMatcher::Output output = matcher.push(delta);
      released += output.released;
      matched = output.matched_stop;
      if (matched.has_value()) break;
    }
    EXPECT_EQ(released, "ab");
    EXPECT_EQ(matched, 1u);
  }
  // Completing at the same character: the earlier start.
  StopStringMatcher tie({"d", "bcd"});
  const StopStringMatcher::Output output = tie.push("abcd");
  EXPECT_EQ(output.released, "a");
  EXPECT_EQ(output.matched_stop, 1u);
}

TEST(StopStringMatcherTest, FlushReleasesTheHeldTail) {
  StopStringMatcher matcher({"abc"});
  EXPECT_EQ(matcher.push("xxab").released, "xx");
  EXPECT_EQ(matcher.flush(), "ab");
}

TEST(StopStringMatcherTest, WithoutStopStringsEverythingIsReleasedAtOnce) {
  StopStringMatcher matcher({});
  EXPECT_EQ(matcher.push("abc").released, "abc");
  EXPECT_EQ(matcher.flush(), "");
}

TEST(StopStringMatcherTest, RandomStreamsReleaseExactlyTheTextBeforeTheFirstStop) {
  SplitMix64 random(99);
  for (int trial = 0; trial < 2000; ++trial) {
    auto random_text = [&](size_t length) {
      std::string text;
      for (size_t index = 0; index < length; ++index) {
        text.push_back(static_cast<char>('a' + random.next() % 3));  // small alphabet: overlaps
      }
      return text;
    };
    std::vector<std::string> stops;
    const int num_stops = static_cast<int>(random.next() % 3);
    for (int index = 0; index < num_stops; ++index) {
      stops.push_back(random_text(1 + random.next() % 4));
    }
    const std::string text = random_text(random.next() % 30);
    // The stop string completing first (then starting first) over the whole text.
    size_t first_stop = std::string::npos;
    size_t first_end = std::string::npos;
    for (const std::string& stop : stops) {
      const size_t position = text.find(stop);
      if (position == std::string::npos) continue;
      const size_t end = position + stop.size();
      if (end < first_end || (end == first_end && position < first_stop)) {
        first_end = end;
        first_stop = position;
      }
    }
    const std::string expected = text.substr(0, first_stop);

    StopStringMatcher matcher(stops);
    std::string released;
    bool matched = false;
    for (size_t position = 0; position < text.size() && !matched;) {
      const size_t length = std::min<size_t>(1 + random.next() % 4, text.size() - position);
      StopStringMatcher::Output output = matcher.push(text.substr(position, length));
      position += length;
      released += output.released;
      matched = output.matched_stop.has_value();
      // Released text never contains or runs into a stop string.
      ASSERT_EQ(released, expected.substr(0, released.size()))
          << "trial " << trial << " text " << text << " stops " << ::testing::PrintToString(stops);
    }
    if (!matched) released += matcher.flush();
    EXPECT_EQ(released, expected) << "trial " << trial;
    EXPECT_EQ(matched, first_stop != std::string::npos) << "trial " << trial;
  }
}

TEST(TextDecoderTest, IncompleteUtf8SuffixCountsOnlyUnfinishedCharacters) {
  EXPECT_EQ(incomplete_utf8_suffix(""), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("abc"), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("a\xC3"), 1u);             // first byte of é
  EXPECT_EQ(incomplete_utf8_suffix("a\xC3\xA9"), 0u);         // é
  EXPECT_EQ(incomplete_utf8_suffix("\xE2\x82"), 2u);          // two of three bytes of €
  EXPECT_EQ(incomplete_utf8_suffix("\xF0\x9F\x98"), 3u);      // three of four bytes
  EXPECT_EQ(incomplete_utf8_suffix("\xF0\x9F\x98\x80"), 0u);  // 😀
}

TEST(TextDecoderTest, SpanDecoderStreamsDeltasHoldingSplitCharacters) {
  // Token 0: "a", token 1: first byte of é, token 2: second byte of é.
  auto decode = [](std::span<const int32_t> tokens) {
    std::string text;
    for (int32_t token : tokens) text += token == 0 ? "a" : token == 1 ? "\xC3" : "\xA9";
    return text;
  };
  std::unique_ptr<TextDecoder> decoder = make_span_text_decoder_factory(decode)();
  EXPECT_EQ(*decoder->push(0), "a");
  EXPECT_EQ(*decoder->push(1), "");
  EXPECT_EQ(*decoder->push(2), "\xC3\xA9");
  EXPECT_EQ(*decoder->push(1), "");
  EXPECT_EQ(decoder->finish(), "\xEF\xBF\xBD") << "a lead byte never completed becomes U+FFFD";
}

TEST(TextDecoderTest, ReplaceInvalidUtf8SubstitutesMaximalSubparts) {
  const std::string replacement = "\xEF\xBF\xBD";
  EXPECT_EQ(replace_invalid_utf8("plain \xC3\xA9 \xF0\x9F\x98\x80"),
            "plain \xC3\xA9 \xF0\x9F\x98\x80");
  EXPECT_EQ(replace_invalid_utf8("\x80"), replacement);
  EXPECT_EQ(replace_invalid_utf8("a\xE2\x82z"), "a" + replacement + "z");  // one subpart
  EXPECT_EQ(replace_invalid_utf8("\xC0\xAF"), replacement + replacement);  // overlong
  EXPECT_EQ(replace_invalid_utf8("\xED\xA0\x80"), replacement + replacement + replacement);
  EXPECT_EQ(replace_invalid_utf8("\xF4\x90\x80\x80"),
            replacement + replacement + replacement + replacement);
  EXPECT_EQ(replace_invalid_utf8("\xF0\x9F\x98"), replacement);
  EXPECT_EQ(replace_invalid_utf8("\xFF\xFE"), replacement + replacement);
}

TEST(TextDecoderTest, SpanDecoderOutputIsTheWholeTextWithInvalidBytesReplaced) {
  // Every split of an ill-formed byte string into one-byte tokens streams the same text as
  // replacing the whole string at once, and every delta is valid UTF-8 on its own.
  const std::vector<std::string> texts = {
      "a\xE2\x82z",           "\xE2\x82\xAC\x80", "\xF0\x9F\x98",         "\xC3", "x\xE0\x80\x80y",
      "\xED\xA0\x80\xC3\xA9", "\xF5\x80\x80\x80", "\x80\x80\x80\x80\x80", "ok",
  };
  for (const std::string& text : texts) {
    auto decode = [&text](std::span<const int32_t> tokens) {
      return text.substr(0, tokens.size());
    };
    std::unique_ptr<TextDecoder> decoder = make_span_text_decoder_factory(decode)();
    std::string streamed;
    for (size_t index = 0; index < text.size(); ++index) {
      const std::string delta = *decoder->push(static_cast<int32_t>(index));
      EXPECT_EQ(replace_invalid_utf8(delta), delta);
      streamed += delta;
    }
    const std::string rest = decoder->finish();
    EXPECT_EQ(replace_invalid_utf8(rest), rest);
    streamed += rest;
    EXPECT_EQ(streamed, replace_invalid_utf8(text));
  }
}

TEST(TextDecoderTest, SpanDecoderRejectsOutputThatIsNotPrefixStable) {
  auto decode = [](std::span<const int32_t> tokens) {
    return tokens.size() == 1 ? std::string("ab") : std::string("xyz");
  };
  std::unique_ptr<TextDecoder> decoder = make_span_text_decoder_factory(decode)();
  EXPECT_EQ(*decoder->push(0), "ab");
  EXPECT_EQ(decoder->push(1).status().code(), StatusCode::kFailedPrecondition);
}

TEST(TextDecoderTest, TokenizerDecoderStreamsExactlyWhatTheSpanDecoderStreams) {
  // The engine's decoder (constant work per token) against the span decoder over the whole
  // decode (the definition): the same delta at every push and the same rest at finish, for
  // random streams rich in byte tokens (split and ill-formed UTF-8), words, control tokens and
  // "▁" spaces, with and without the leading-space strip.
  const tokenizer::Tokenizer tokenizer =
      *tokenizer::Tokenizer::from_vocabulary(*tokenizer::build_llama_vocabulary(32000));
  std::vector<int32_t> byte_tokens;
  for (int byte = 0; byte < 256; ++byte) {
    byte_tokens.push_back(*tokenizer.find_piece(fmt::format("<0x{:02X}>", byte)));
  }
  SplitMix64 random(11);
  for (int trial = 0; trial < 300; ++trial) {
    tokenizer::DecodeOptions options;
    options.strip_leading_space = trial % 2 == 0;
    options.render_special = trial % 5 == 0;
    std::unique_ptr<TextDecoder> incremental =
        make_tokenizer_text_decoder_factory(&tokenizer, options)();
    std::unique_ptr<TextDecoder> span = make_span_text_decoder_factory(
        [&](std::span<const int32_t> ids) { return tokenizer.decode(ids, options).value(); })();
    const int length = 1 + static_cast<int>(random.next() % 40);
    for (int index = 0; index < length; ++index) {
      const uint64_t kind = random.next() % 4;
      const int32_t token =
          kind <= 1   ? byte_tokens[random.next() % (kind == 0 ? 256 : 128)]  // bytes, often ASCII
          : kind == 2 ? static_cast<int32_t>(random.next() % 3)               // <unk>, <s>, </s>
                      : static_cast<int32_t>(random.next() % tokenizer.vocab_size());
      const Result<std::string> expected = span->push(token);
      ASSERT_TRUE(expected.ok()) << expected.status().to_string();
      const Result<std::string> delta = incremental->push(token);
      ASSERT_TRUE(delta.ok()) << delta.status().to_string();
      EXPECT_EQ(*delta, *expected) << "trial " << trial << " token " << index;
    }
    EXPECT_EQ(incremental->finish(), span->finish()) << "trial " << trial;
  }
}

TEST(TextDecoderTest, TokenizerDecoderRefusesAnIdOutsideTheVocabularyAndStaysUsable) {
  const tokenizer::Tokenizer tokenizer =
      *tokenizer::Tokenizer::from_vocabulary(*tokenizer::build_llama_vocabulary(32000));
  std::unique_ptr<TextDecoder> decoder = make_tokenizer_text_decoder_factory(&tokenizer, {})();
  const int32_t e_acute_lead = *tokenizer.find_piece("<0xC3>");
  const int32_t e_acute_tail = *tokenizer.find_piece("<0xA9>");
  EXPECT_EQ(*decoder->push(e_acute_lead), "");
  EXPECT_EQ(decoder->push(32000).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(decoder->push(-1).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(*decoder->push(e_acute_tail), "\xC3\xA9");
  EXPECT_EQ(decoder->finish(), "");
}

}  // namespace
}  // namespace folio::engine

// A corpus of texts that every tokenizer must encode and decode back to the same bytes.
#pragma once

#include <string>
#include <vector>

namespace folio::tokenizer::testing {

// Texts every tokenizer must round-trip (decode(encode(text)) == text): ASCII, Unicode (Latin,
// Cyrillic, CJK, emoji with joiners, combining marks), whitespace runs, control bytes, and bytes
// that are not valid UTF-8 (so byte fallback is needed).
inline std::vector<std::string> round_trip_corpus() {
  return {
      "",
      "a",
      "Hello world",
      "The lighthouse on the northern point had been dark for eleven years.",
      " leading space",
      "trailing space ",
      "  two leading and   three inner   ",
      "\t\ttabs\tand\nnew\n\nlines\r\n",
      "   \n   \n",
      "numbers 0 12 345 6789 3.14159 1e-5 1,000,000",
      "punctuation!? (brackets) [more] {braces} <angles> 'quotes' \"double\" - -- ---",
      "caf\xc3\xa9 na\xc3\xafve F\xc3\xbchrer \xc5\x93uvre",
      "\xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe \xd0\xbd\xd0\xb0 "
      "\xd0\x91\xd1\x8a\xd0\xbb\xd0\xb3\xd0\xb0\xd1\x80\xd1\x81\xd0\xba\xd0\xb8",
      "\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8"
      "apple\xe5\xb7\xa5\xe4\xbd\x9c"
      "1314151\xe5\xa4\xa9\xef\xbd\x9e",
      "\xf0\x9f\xa6\x99 llama \xf0\x9f\x9a\x80 rocket "
      "\xf0\x9f\x98\xb6\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f fog",
      "e\xcc\x81 combining acute, a\xcc\x8a ring",
      std::string("control \x01\x02\x1b[0m bytes \x7f and a NUL:") + std::string(1, '\0') + "end",
      "invalid \xff\xfe bytes \xc3 alone \xe4\xb8 cut \xed\xa0\x80 surrogate \xc0\xaf overlong",
      "\x80\x80\x80",
      "<s> and </s> and <unk> written as text",
      "<|endoftext|> written as text",
      "It's we've they'll I'd YOU'RE",
  };
}

}  // namespace folio::tokenizer::testing

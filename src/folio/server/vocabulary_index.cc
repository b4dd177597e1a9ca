#include "folio/server/vocabulary_index.h"

#include <algorithm>
#include <utility>

#include "folio/base/check.h"

namespace folio::server {

Result<std::shared_ptr<const VocabularyIndex>> VocabularyIndex::create(
    const tokenizer::Tokenizer& tokenizer) {
  std::shared_ptr<VocabularyIndex> index(new VocabularyIndex());
  const auto vocab_size = static_cast<int32_t>(tokenizer.vocab_size());
  const std::vector<tokenizer::TokenType>& types = tokenizer.vocabulary().types;
  index->vocab_size_ = vocab_size;
  index->bytes_offset_.reserve(static_cast<size_t>(vocab_size) + 1);
  index->bytes_offset_.push_back(0);
  std::vector<int32_t> generable;
  for (int32_t token = 0; token < vocab_size; ++token) {
    if (tokenizer.is_end_of_generation(token)) index->end_of_generation_.push_back(token);
    bool candidate = false;
    switch (types[token]) {
      case tokenizer::TokenType::kUndefined:
      case tokenizer::TokenType::kNormal:
      case tokenizer::TokenType::kUserDefined:
      case tokenizer::TokenType::kByte:
        candidate = true;
        break;
      case tokenizer::TokenType::kUnknown:
      case tokenizer::TokenType::kControl:
      case tokenizer::TokenType::kUnused:
        break;
    }
    if (candidate) {
      Result<std::string> bytes = tokenizer.token_bytes(token);
      if (!bytes.ok()) return bytes.status().with_context("indexing the vocabulary");
      if (!bytes->empty()) {
        index->bytes_ += *bytes;
        generable.push_back(token);
      }
    }
    index->bytes_offset_.push_back(static_cast<uint32_t>(index->bytes_.size()));
  }

  std::sort(generable.begin(), generable.end(), [&](int32_t a, int32_t b) {
    const std::string_view bytes_a = index->token_bytes(a);
    const std::string_view bytes_b = index->token_bytes(b);
    return bytes_a != bytes_b ? bytes_a < bytes_b : a < b;
  });
  index->trie_ = index->build_trie(generable);
  const ByteSet plain = plain_bytes();
  std::vector<int32_t> non_plain;
  index->plain_tokens_.assign((static_cast<size_t>(vocab_size) + 63) / 64, 0);
  for (int32_t token : generable) {
    const std::string_view bytes = index->token_bytes(token);
    if (std::all_of(bytes.begin(), bytes.end(),
                    [&](char c) { return plain.contains(static_cast<uint8_t>(c)); })) {
      index->plain_tokens_[static_cast<size_t>(token) >> 6] |= uint64_t{1} << (token & 63);
      index->plain_max_length_ =
          std::max(index->plain_max_length_, static_cast<int32_t>(bytes.size()));
    } else {
      non_plain.push_back(token);  // still in byte order
    }
  }
  index->non_plain_trie_ = index->build_trie(non_plain);
  return std::shared_ptr<const VocabularyIndex>(std::move(index));
}

ByteSet VocabularyIndex::plain_bytes() {
  return ByteSet::range(0x20, 0x7E).remove('"').remove('\\');
}

VocabularyIndex::Trie VocabularyIndex::build_trie(const std::vector<int32_t>& tokens) const {
  // Sorted by bytes, tokens sharing a prefix are neighbours: the trie is built in one pass that
  // keeps the path to the previous token open and closes the nodes past the common prefix.
  Trie trie;
  std::vector<TrieNode>& nodes = trie.nodes;
  nodes.push_back(
      TrieNode{.subtree_end = 0, .tokens_begin = 0, .tokens_end = 0, .depth = 0, .byte = 0});
  std::vector<int32_t> path = {0};  // path[d]: the open node at depth d
  std::string_view previous;
  for (int32_t token : tokens) {
    const std::string_view bytes = token_bytes(token);
    size_t common = 0;
    while (common < previous.size() && common < bytes.size() && previous[common] == bytes[common]) {
      ++common;
    }
    while (path.size() > common + 1) {
      nodes[path.back()].subtree_end = static_cast<int32_t>(nodes.size());
      path.pop_back();
    }
    for (size_t depth = common + 1; depth <= bytes.size(); ++depth) {
      path.push_back(static_cast<int32_t>(nodes.size()));
      const auto first = static_cast<int32_t>(trie.tokens.size());
      nodes.push_back(TrieNode{.subtree_end = 0,
                               .tokens_begin = first,
                               .tokens_end = first,
                               .depth = static_cast<int32_t>(depth),
                               .byte = static_cast<uint8_t>(bytes[depth - 1])});
    }
    // Tokens arrive in trie order, so the token lands at the end of its node's range.
    TrieNode& node = nodes[path.back()];
    FOLIO_CHECK(node.tokens_end == static_cast<int32_t>(trie.tokens.size()));
    trie.tokens.push_back(token);
    ++node.tokens_end;
    trie.max_depth = std::max(trie.max_depth, static_cast<int32_t>(bytes.size()));
    previous = bytes;
  }
  while (!path.empty()) {
    nodes[path.back()].subtree_end = static_cast<int32_t>(nodes.size());
    path.pop_back();
  }
  return trie;
}

std::string_view VocabularyIndex::token_bytes(int32_t token) const {
  if (token < 0 || token >= vocab_size_) return {};
  const uint32_t begin = bytes_offset_[token];
  return std::string_view(bytes_).substr(begin, bytes_offset_[token + 1] - begin);
}

bool VocabularyIndex::is_generable(int32_t token) const {
  return !token_bytes(token).empty();
}

}  // namespace folio::server

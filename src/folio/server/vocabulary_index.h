// VocabularyIndex: every token's bytes, arranged in a trie for computing a structured-output
// mask (structured_output.h) by walking the trie with the grammar's automaton: a prefix the
// grammar refuses prunes every token under it at once.
//
// Terms: a *generable* token is one a constraint may ever allow by its bytes: a normal, byte or
// user-defined token with at least one byte. Control, unknown and unused tokens are not (they
// are allowed only as end tokens, which a constraint is given separately); nor are tokens whose
// bytes are empty (they would advance nothing, so a model could repeat them forever).
//
// The trie is stored in preorder: node 0 is the root (the empty prefix); a node's subtree is
// [node, subtree_end); a node's depth is the length of its prefix and `byte` its last byte. A
// walk keeps one automaton state per depth and skips a refused node's subtree by jumping to its
// subtree_end, so its cost is the number of prefixes the grammar allows, not vocab x length.
//
// Built once per tokenizer (the server keeps one); immutable afterwards.
// Thread-safety: immutable, share freely.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/result.h"
#include "folio/server/grammar.h"
#include "folio/tokenizer/tokenizer.h"

namespace folio::server {

class VocabularyIndex {
 public:
  struct TrieNode {
    int32_t subtree_end;   // one past the last node of this node's subtree
    int32_t tokens_begin;  // tokens whose bytes end here: Trie::tokens[tokens_begin, tokens_end)
    int32_t tokens_end;
    int32_t depth;  // bytes from the root
    uint8_t byte;   // the edge into this node (unused for the root)
  };
  struct Trie {
    std::vector<TrieNode> nodes;  // preorder; nodes[0] is the root
    std::vector<int32_t> tokens;  // token ids in trie order
    int32_t max_depth = 0;
  };

  // kInvalidArgument when the tokenizer fails to give a token's bytes (a broken vocabulary).
  static Result<std::shared_ptr<const VocabularyIndex>> create(
      const tokenizer::Tokenizer& tokenizer);

  // Printable ASCII except '"' and '\\': the bytes that stand for themselves inside a JSON
  // string. A *plain* token has only such bytes.
  static ByteSet plain_bytes();

  int32_t vocab_size() const { return vocab_size_; }
  // The bytes a token adds to the text; empty for tokens that are not generable.
  std::string_view token_bytes(int32_t token) const;
  bool is_generable(int32_t token) const;
  int32_t num_generable() const { return static_cast<int32_t>(trie_.tokens.size()); }
  // The tokens after which generation stops (Tokenizer::is_end_of_generation: EOS, end of turn,
  // end of message), ascending: the end tokens a StructuredOutput is usually given.
  const std::vector<int32_t>& end_of_generation_tokens() const { return end_of_generation_; }

  // Every generable token.
  const Trie& trie() const { return trie_; }
  // The generable tokens that are not plain, and the plain ones as a bitset over the vocabulary
  // (bit t of word t / 64): where every plain token is known to be allowed (inside a JSON
  // string), only this smaller trie needs a walk.
  const Trie& non_plain_trie() const { return non_plain_trie_; }
  const std::vector<uint64_t>& plain_tokens() const { return plain_tokens_; }
  // The longest plain token's length in bytes (0 when there is none).
  int32_t plain_max_length() const { return plain_max_length_; }

 private:
  VocabularyIndex() = default;
  // Builds a trie over `tokens`, which must be sorted by their bytes.
  Trie build_trie(const std::vector<int32_t>& tokens) const;

  int32_t vocab_size_ = 0;
  std::string bytes_;                   // every generable token's bytes, concatenated
  std::vector<uint32_t> bytes_offset_;  // [vocab_size + 1]; equal neighbours: not generable
  Trie trie_;
  Trie non_plain_trie_;
  std::vector<uint64_t> plain_tokens_;
  int32_t plain_max_length_ = 0;
  std::vector<int32_t> end_of_generation_;
};

}  // namespace folio::server

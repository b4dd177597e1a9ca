"""SentencePiece BPE vocabulary for the corpus, laid out the way Llama's tokenizer is.

Settings chosen so that the text round-trips exactly (decode(encode(s)) == s) and Folio's
SentencePiece encoder (score-ordered greedy merges, byte fallback) gives the same ids as the
sentencepiece library:
  - identity normalization, no whitespace squeezing: the text is tokenized as it is;
  - no dummy prefix: every line, including the first, starts without "▁", both when training
    (one verse per sentence) and when encoding the whole text (GGUF add_space_prefix = false);
  - "\n" is never a piece (training sentences are single lines): it is spelled by the byte
    token <0x0A> through byte fallback, as is any other character the vocabulary lacks.
Ids: 0 <unk> (llama type 2), 1 <s> (BOS, control 3), 2 </s> (EOS, control 3), 3..258 the byte
tokens <0x00>..<0xFF> (type 6), then the BPE pieces (normal, 1) with descending scores.
"""
import io

import sentencepiece

UNKNOWN_ID, BOS_ID, EOS_ID = 0, 1, 2
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_BYTE = 1, 2, 3, 6


def train_tokenizer(train_text, vocab_size, model_prefix):
    """Trains on the verses of train_text; writes model_prefix.model and returns the processor."""
    sentences = [line for line in train_text.split("\n") if line]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=model_prefix, vocab_size=vocab_size,
        model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=False, split_digits=True,
        character_coverage=1.0, unk_id=UNKNOWN_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=-1,
        num_threads=2, minloglevel=2)
    return sentencepiece.SentencePieceProcessor(model_file=model_prefix + ".model")


def vocabulary_entries(processor):
    """[(piece, score, llama token type)] in id order."""
    entries = []
    for token_id in range(processor.get_piece_size()):
        if processor.is_unknown(token_id):
            token_type = TYPE_UNKNOWN
        elif processor.is_control(token_id):
            token_type = TYPE_CONTROL
        elif processor.is_byte(token_id):
            token_type = TYPE_BYTE
        else:
            token_type = TYPE_NORMAL
        entries.append((processor.id_to_piece(token_id), processor.get_score(token_id),
                        token_type))
    return entries


def encode_document(processor, text):
    """[BOS] + the ids of the whole text (the perplexity and training token stream)."""
    return [BOS_ID] + processor.encode(text)

// Attention metadata beyond the basic shape, as GGUF keys to and from LlamaShape: the sliding
// window and which layers use it (Gemma interleaves local and global layers), and logit
// soft-capping (Gemma 2's attention scores and final logits).
//
// Keys (prefix "<arch>."), read with llama.cpp's defaults:
//   attention.sliding_window   the window of sliding layers. gemma2: default 4096 (llama.cpp's);
//                              gemma3 and the others: absent means no window (every layer
//                              global). Which layers slide: llama_sliding_window_pattern.
//   attn_logit_softcapping     gemma2: default 50. gemma3: llama.cpp ignores it and Hugging Face
//                              applies it, so a value > 0 is refused naming the key rather than
//                              guessed. Other architectures: not read (llama.cpp does not).
//   final_logit_softcapping    gemma2: default 30; gemma3: default 0 (none). Others: not read.
//   attention.sliding_window_pattern, rope.freq_base_swa   Gemma: llama.cpp fixes them per
//                              architecture and does not read them; a file may carry them only
//                              with those values (2 or 6; gemma3's 10000, gemma2's
//                              rope.freq_base), else it is refused naming the key.
// A soft cap c maps x to c * tanh(x / c): near x for |x| << c, never beyond c.
#pragma once

#include <cstdint>
#include <string>

#include "folio/base/result.h"
#include "folio/gguf/gguf_file.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/model/llama_model_file.h"

namespace folio::model {

// Layers per period of the architecture's local/global interleaving: layer i slides its window
// when the pattern is 0 (every layer: Mistral) or i % pattern < pattern - 1 (llama.cpp's
// set_swa_pattern: gemma2 2, gemma3 6). The last layer of each period is global.
int64_t llama_sliding_window_pattern(LlamaArchitecture architecture);

// The RoPE frequency base of Gemma 3's local layers (llama.cpp's rope_freq_base_train_swa);
// they rotate without the file's RoPE scaling.
inline constexpr float kGemmaLocalRopeTheta = 10000.0f;

// Writes attention.sliding_window (when > 0, or always for gemma2) and the soft caps (gemma2:
// both, always; gemma3: the final cap when > 0). Nothing for shapes without them, so the bytes
// of other models stay what they were.
void add_attention_metadata(const LlamaShape& shape, const std::string& prefix,
                            gguf::GgufWriter& writer);

// Reads the keys above into shape.sliding_window and the soft caps (the architecture is set).
// kInvalidArgument naming the key: a value of the wrong type, a negative window, a soft cap
// that is not positive and finite, gemma3's attn_logit_softcapping, a Gemma layer pattern or
// local RoPE base other than the architecture's.
Status read_attention_metadata(const gguf::GgufFile& file, const std::string& prefix,
                               LlamaShape& shape);

// kInvalidArgument naming the field: a soft cap that is negative or not finite; a soft cap on
// an architecture other than Gemma; gemma2 without both caps or without a window; gemma3 with
// an attention cap; a Gemma whose output is not tied to token_embd.weight (naming
// output.weight) or with rope_freqs.weight.
Status validate_attention_metadata(const LlamaShape& shape);

}  // namespace folio::model

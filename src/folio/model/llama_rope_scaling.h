// RoPE scaling as GGUF metadata: the <arch>.rope.scaling.* keys llama.cpp reads and writes,
// to and from ir::RopeScaling (the rope op's attributes), and the range each kind's parameters
// must lie in. Kinds: none; linear (positions divided by `factor`); llama3 (Llama 3.1:
// factor, low_freq_factor, high_freq_factor, original_context_length); yarn (factor,
// original_context_length, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast,
// yarn_beta_slow). llama.cpp's converter stores Llama 3.1's factors as a rope_freqs.weight
// tensor instead (llama_model_file.h reads it), and longrope (Phi-3's long-context variants)
// and DeepSeek's yarn_log_multiplier are not implemented: reading refuses them naming the key.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "folio/base/result.h"
#include "folio/gguf/gguf_file.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/ir/op.h"

namespace folio::model {

// "none", "linear", "llama3", "yarn": rope.scaling.type's values.
std::string_view rope_scaling_type_name(ir::RopeScalingKind kind);

// Writes `prefix`type, factor and the kind's own keys (prefix: "<arch>.rope.scaling."); nothing
// for kNone, so the bytes of unscaled models stay what they were.
void add_rope_scaling_metadata(const ir::RopeScaling& scaling, const std::string& prefix,
                               gguf::GgufWriter& writer);

// Reads the scaling as llama.cpp does (prefix: "<arch>."): rope.scaling.type, default linear;
// rope.scaling.factor or the older rope.scale_linear, absent or 1 meaning no scaling; the
// kind's keys with llama.cpp's defaults (yarn: original context `context_length`, ext and attn
// factors 1, the attn factor times rope.scaling.attn_factor, betas 32 and 1). kInvalidArgument
// naming the key: another type, llama3 or yarn without a factor, yarn_log_multiplier.
Result<ir::RopeScaling> read_rope_scaling(const gguf::GgufFile& file, const std::string& prefix,
                                          int64_t context_length);

// kInvalidArgument: a factor that is not positive and finite, llama3 or yarn parameters out of
// their range (the op signature's), or frequency factors from a rope_freqs tensor as well as
// from llama3 or yarn scaling (the kernel applies one set).
Status validate_rope_scaling(const ir::RopeScaling& scaling, bool rope_frequency_factors);

}  // namespace folio::model

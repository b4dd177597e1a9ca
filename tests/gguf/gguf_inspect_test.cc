// `folio inspect` output: header, metadata (long arrays abbreviated), tensor table and totals.
#include "folio/gguf/gguf_inspect.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/model/llama_model_file.h"
#include "testing/llama_shapes.h"

namespace folio::gguf {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(GgufInspectTest, SummarizesAGeneratedModel) {
  model::LlamaShape shape = folio::testing::tiny_llama_shape();
  shape.weight_dtype = DType::kQ8_0;
  const GgufFile file = *GgufFile::parse_owned(
      *model::make_random_llama_writer(shape, 1)->write_to_buffer(), "m.gguf");
  const std::string summary = render_gguf_summary(file);
  EXPECT_THAT(summary, HasSubstr("file: m.gguf"));
  EXPECT_THAT(summary, HasSubstr("GGUF version 3, alignment 32"));
  EXPECT_THAT(summary, HasSubstr("llama.embedding_length"));
  // 300 tokens, of which 8 are shown.
  EXPECT_THAT(summary, HasSubstr("[string x 300] [\"<unk>\", \"<s>\", \"</s>\", \"<0x00>\""));
  EXPECT_THAT(summary, Not(HasSubstr("<0x10>")));
  EXPECT_THAT(summary, HasSubstr("token_embd.weight"));
  EXPECT_THAT(summary, HasSubstr("[32, 300]"));
  // 12 tensors: embeddings, 9 per layer, output norm, output.
  EXPECT_THAT(summary,
              HasSubstr(fmt::format("totals: 12 tensors, {} parameters", shape.parameter_count())));
  EXPECT_THAT(summary, HasSubstr("q8_0"));
  InspectOptions options;
  options.show_tensors = false;
  EXPECT_THAT(render_gguf_summary(file, options), Not(HasSubstr("attn_q.weight")));
}

TEST(GgufInspectTest, FormatsByteSizes) {
  EXPECT_EQ(format_byte_size(512), "512 B");
  EXPECT_EQ(format_byte_size(1536), "1.50 KiB");
  EXPECT_EQ(format_byte_size(uint64_t{3} << 30), "3.00 GiB");
}

TEST(GgufInspectTest, EscapesControlBytesInStrings) {
  EXPECT_EQ(render_gguf_value(GgufValue::of_string("a\nb\x01\"")), "\"a\\nb\\x01\\\"\"");
  EXPECT_EQ(render_gguf_value(GgufValue::of_string(std::string(100, 'x')), 8, 4), "\"xxxx...\"");
}

}  // namespace
}  // namespace folio::gguf

// Every class of malformed GGUF input is rejected with a Status naming the field and its byte
// offset, never a crash or an out-of-bounds read (the asan preset runs these under
// AddressSanitizer; the fuzzer in fuzz/ explores beyond these hand-written cases).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/gguf/gguf_file.h"
#include "folio/gguf/gguf_writer.h"
#include "testing/raw_gguf.h"

namespace folio::gguf {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::RawGguf;

Status parse_status(const std::vector<uint8_t>& bytes, const GgufLimits& limits = {}) {
  return GgufFile::parse(bytes, "bad.gguf", limits).status();
}

void expect_corrupt(const RawGguf& raw, std::string_view detail, uint64_t offset) {
  const Status status = parse_status(raw.bytes);
  EXPECT_EQ(status.code(), StatusCode::kDataLoss) << status.to_string();
  EXPECT_THAT(status.message(), HasSubstr(std::string(detail)));
  EXPECT_THAT(status.message(), HasSubstr(fmt::format("(at byte offset {})", offset)));
}

std::vector<uint8_t> small_model_file() {
  GgufWriter writer;
  writer.set("general.architecture", GgufValue::of_string("llama"));
  writer.set("tokenizer.ggml.tokens", GgufValue::array_of_strings({"a", "bc", ""}));
  const std::array<int32_t, 2> values = {1, 2};
  writer.set("nested", GgufValue::array_of_arrays({GgufValue::array_of<int32_t>(values)}));
  writer.set("flag", GgufValue::of(true));
  std::vector<std::byte> first(12, std::byte{1});
  std::vector<std::byte> second(34, std::byte{2});
  FOLIO_CHECK(writer.add_tensor_bytes("first", DType::kF32, {3}, first).ok());
  FOLIO_CHECK(writer.add_tensor_bytes("second", DType::kQ8_0, {32}, second).ok());
  return *writer.write_to_buffer();
}

TEST(GgufCorruptionTest, EveryTruncationBeforeTheLastTensorByteIsAnError) {
  const std::vector<uint8_t> full = small_model_file();
  Result<GgufFile> reference = GgufFile::parse(full);
  ASSERT_TRUE(reference.ok()) << reference.status().to_string();
  const GgufTensorInfo& last = reference->tensors().back();
  const uint64_t needed = reference->data_offset() + last.offset + last.byte_size;
  ASSERT_LT(needed, full.size());  // the writer pads after the last tensor too
  for (size_t length = 0; length <= full.size(); ++length) {
    const std::vector<uint8_t> prefix(full.begin(), full.begin() + length);
    const Status status = parse_status(prefix);
    if (length < needed) {
      EXPECT_EQ(status.code(), StatusCode::kDataLoss) << "prefix of " << length << " bytes";
      EXPECT_THAT(status.message(), AllOf(HasSubstr("bad.gguf"), HasSubstr("byte offset")));
    } else {
      EXPECT_TRUE(status.ok()) << "prefix of " << length << " bytes: " << status.to_string();
    }
  }
}

TEST(GgufCorruptionTest, HeaderProblemsAreNamed) {
  RawGguf bad_magic;
  bad_magic.append("GGUX", 4).u32(3).u64(0).u64(0);
  expect_corrupt(bad_magic, "not a GGUF file", 0);
  RawGguf legacy;
  legacy.u32(0x67676a74).u32(3).u64(0).u64(0);  // 'ggjt'
  expect_corrupt(legacy, "legacy ggml/ggjt", 0);

  RawGguf version_one;
  version_one.header(1, 0, 0);
  Status status = parse_status(version_one.bytes);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("version 1 (at byte offset 4) is not supported"));
  RawGguf big_endian;
  big_endian.header(0x03000000, 0, 0);
  EXPECT_THAT(parse_status(big_endian.bytes).message(), HasSubstr("big-endian"));
  RawGguf future;
  future.header(9, 0, 0);
  EXPECT_THAT(parse_status(future.bytes).message(), HasSubstr("version 9"));

  RawGguf version_two;  // v2 has the same layout as v3
  version_two.header(2, 0, 1).key_u32("k", 5);
  ASSERT_TRUE(GgufFile::parse(version_two.bytes).ok());
  EXPECT_EQ(GgufFile::parse(version_two.bytes)->version(), 2u);
}

TEST(GgufCorruptionTest, HugeCountsAreRejectedBeforeAllocating) {
  RawGguf tensors;
  tensors.header(3, uint64_t{1} << 62, 0);
  expect_corrupt(tensors, "tensor count 4611686018427387904 cannot fit", 8);
  RawGguf metadata;
  metadata.header(3, 0, ~uint64_t{0});
  expect_corrupt(metadata, "metadata count 18446744073709551615 cannot fit", 16);

  RawGguf key;
  key.header(3, 0, 1).u64(uint64_t{1} << 63).zeros(16);
  expect_corrupt(key, "key length 9223372036854775808 exceeds the limit", 24);
  RawGguf key_past_end;
  key_past_end.header(3, 0, 1).u64(1000).zeros(16);
  expect_corrupt(key_past_end, "truncated: key needs 1000 bytes but only 16 remain", 32);

  RawGguf array;  // key "a" at 24..33, type at 33, element type at 37, count at 41
  array.header(3, 0, 1).str("a").u32(9).u32(4).u64(uint64_t{1} << 30).zeros(8);
  expect_corrupt(array, "uint32 array length 1073741824 cannot fit", 41);
  RawGguf strings;
  strings.header(3, 0, 1).str("a").u32(9).u32(8).u64(1000).zeros(8);
  expect_corrupt(strings, "string array length 1000 cannot fit", 41);
  RawGguf string_element;
  string_element.header(3, 0, 1).str("a").u32(9).u32(8).u64(2).str("x").u64(99);
  expect_corrupt(string_element, "string element 1 needs 99 bytes", 66);

  RawGguf limited;
  limited.header(3, 0, 1).str("a").u32(8).str("long");
  GgufLimits limits;
  limits.max_string_bytes = 3;
  EXPECT_THAT(parse_status(limited.bytes, limits).message(),
              HasSubstr("string value length 4 exceeds the limit of 3 bytes"));
  limits = GgufLimits{};
  limits.max_array_elements = 2;
  RawGguf long_array;
  long_array.header(3, 0, 1).str("a").u32(9).u32(0).u64(3).zeros(3);
  EXPECT_THAT(parse_status(long_array.bytes, limits).message(),
              HasSubstr("array length 3 exceeds the limit of 2"));
}

TEST(GgufCorruptionTest, MalformedMetadataValuesAreNamed) {
  RawGguf bad_type;
  bad_type.header(3, 0, 1).str("general.name").u32(13).zeros(8);
  expect_corrupt(bad_type, "metadata entry #0 'general.name': value type 13 is not a GGUF", 44);
  RawGguf bad_element_type;
  bad_element_type.header(3, 0, 1).str("a").u32(9).u32(77).u64(0);
  expect_corrupt(bad_element_type, "array element type 77", 37);
  RawGguf bad_bool;
  bad_bool.header(3, 0, 1).str("a").u32(7).u8(2);
  expect_corrupt(bad_bool, "bool value 2 is neither 0 nor 1", 37);
  RawGguf bad_bool_element;
  bad_bool_element.header(3, 0, 1).str("a").u32(9).u32(7).u64(3).u8(1).u8(0).u8(9);
  expect_corrupt(bad_bool_element, "bool value 9", 51);
  RawGguf empty_key;
  empty_key.header(3, 0, 1).str("").u32(0).u8(1).zeros(8);
  expect_corrupt(empty_key, "key is empty", 24);
  RawGguf duplicate;
  duplicate.header(3, 0, 2).key_u32("k", 1).key_u32("k", 2);
  expect_corrupt(duplicate, "metadata entry #1 'k': key appears twice", 41);

  RawGguf nested;  // 5 levels of arrays, one deeper than the default limit
  nested.header(3, 0, 1).str("a").u32(9);
  for (int level = 0; level < 4; ++level) nested.u32(9).u64(1);
  nested.u32(0).u64(0);
  const Status status = parse_status(nested.bytes);
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("arrays nest deeper than the limit of 4"));
}

TEST(GgufCorruptionTest, BadAlignmentIsNamed) {
  RawGguf not_power_of_two;
  not_power_of_two.header(3, 0, 1).key_u32("general.alignment", 48);
  expect_corrupt(not_power_of_two, "alignment 48 is not a power of two", 24);
  RawGguf zero;
  zero.header(3, 0, 1).key_u32("general.alignment", 0);
  expect_corrupt(zero, "alignment 0 is not a power of two", 24);
  RawGguf wrong_type;
  wrong_type.header(3, 0, 1).str("general.alignment").u32(10).u64(32);
  expect_corrupt(wrong_type, "must be a uint32, found a uint64", 24);
}

// A header with no metadata and `count` tensor infos starts its first info at byte 24.
TEST(GgufCorruptionTest, MalformedTensorInfosAreNamed) {
  RawGguf empty_name;
  empty_name.header(3, 1, 0).tensor_info("", {4}, 0, 0);
  expect_corrupt(empty_name, "tensor info #0: name is empty", 24);
  RawGguf long_name;
  long_name.header(3, 1, 0).tensor_info(std::string(65, 'n'), {4}, 0, 0);
  expect_corrupt(long_name, "name length 65 exceeds the limit of 64 bytes", 24);
  RawGguf duplicate;
  duplicate.header(3, 2, 0).tensor_info("w", {4}, 0, 0).tensor_info("w", {4}, 0, 32);
  expect_corrupt(duplicate, "tensor info #1 'w': name appears twice", 24 + 33);
  RawGguf five_dimensions;
  five_dimensions.header(3, 1, 0).tensor_info("w", {1, 1, 1, 1, 1}, 0, 0);
  expect_corrupt(five_dimensions, "5 dimensions exceed the maximum of 4", 33);
  RawGguf overflow;
  overflow.header(3, 1, 0).tensor_info("w", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0);
  expect_corrupt(overflow, "dimension 1 = 1099511627776 makes the element count overflow", 45);
  RawGguf negative;
  negative.header(3, 1, 0).tensor_info("w", {~uint64_t{0}}, 0, 0);
  expect_corrupt(negative, "dimension 0 = 18446744073709551615", 37);
  RawGguf byte_overflow;  // 2^62 f32 elements: the element count fits, the byte size does not
  byte_overflow.header(3, 1, 0).tensor_info("w", {uint64_t{1} << 62}, 0, 0);
  expect_corrupt(byte_overflow, "byte size overflows 64 bits", 33);
  RawGguf unknown_type;
  unknown_type.header(3, 1, 0).tensor_info("w", {4}, 4, 0);  // q4_2, long retired
  expect_corrupt(unknown_type, "ggml type 4 is unknown", 45);
  RawGguf partial_block;
  partial_block.header(3, 1, 0).tensor_info("w", {31}, 8, 0);
  expect_corrupt(partial_block, "row length 31 is not a multiple of the q8_0 block size 32", 33);
}

TEST(GgufCorruptionTest, TensorDataOutsideTheFileOrOverlappingIsNamed) {
  // One tensor info of name "w" and 1 dimension: 8+1+4+8+4+8 = 33 bytes; offset field at 49.
  RawGguf misaligned;
  misaligned.header(3, 1, 0).tensor_info("w", {4}, 0, 4).pad_to(32).zeros(64);
  expect_corrupt(misaligned, "tensor 'w': data offset 4 is not a multiple of the alignment 32", 49);
  RawGguf past_end;
  past_end.header(3, 1, 0).tensor_info("w", {4}, 0, 32).pad_to(32).zeros(40);
  expect_corrupt(past_end, "data [32, +16) extends past the end of the data section", 49);
  RawGguf wrapping;  // offset + size wraps around 2^64
  wrapping.header(3, 1, 0).tensor_info("w", {64}, 0, ~uint64_t{0} - 31).pad_to(32).zeros(256);
  expect_corrupt(wrapping, "extends past the end of the data section", 49);
  RawGguf overlapping;
  overlapping.header(3, 2, 0)
      .tensor_info("a", {16}, 0, 32)
      .tensor_info("b", {16}, 0, 0)
      .pad_to(32)
      .zeros(128);
  expect_corrupt(overlapping, "tensor 'a': data [32, 96) overlaps tensor 'b' at [0, 64)", 24);
  RawGguf disjoint = overlapping;  // the same tensors placed apart parse fine, in any order
  disjoint.bytes[24 + 8 + 1 + 4 + 8 + 4] = 64;
  ASSERT_TRUE(GgufFile::parse(disjoint.bytes).ok()) << parse_status(disjoint.bytes).to_string();
}

}  // namespace
}  // namespace folio::gguf

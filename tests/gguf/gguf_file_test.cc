// GgufFile and GgufWriter: files written by the writer read back identically (every metadata
// type, tensors, alignment), and files the writer would never produce are rejected with errors
// that name the field and its byte offset.
#include "folio/gguf/gguf_file.h"

#include <array>
#include <cstdio>
#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/gguf/gguf_writer.h"
#include "testing/raw_gguf.h"

namespace folio::gguf {
namespace {

using ::testing::HasSubstr;
using testing::RawGguf;

std::vector<std::byte> iota_bytes(size_t count, uint8_t start) {
  std::vector<std::byte> bytes(count);
  for (size_t i = 0; i < count; ++i) bytes[i] = std::byte(static_cast<uint8_t>(start + i * 7));
  return bytes;
}

// One entry of every value type, including arrays of every element type and nested arrays.
std::vector<std::pair<std::string, GgufValue>> every_value_type() {
  const std::array<uint8_t, 3> u8s = {0, 7, 255};
  const std::array<int8_t, 2> i8s = {-128, 127};
  const std::array<uint16_t, 2> u16s = {0, 65535};
  const std::array<int16_t, 2> i16s = {-32768, 32767};
  const std::array<uint32_t, 2> u32s = {1, 4000000000u};
  const std::array<int32_t, 3> i32s = {-5, 0, 2147483647};
  const std::array<float, 3> f32s = {1.5f, -0.0f, 3.25e-20f};
  const std::array<bool, 3> bools = {true, false, true};
  const std::array<uint64_t, 1> u64s = {18446744073709551615ull};
  const std::array<int64_t, 2> i64s = {-9223372036854775807ll - 1, 42};
  const std::array<double, 2> f64s = {1e300, -2.5};
  std::vector<GgufValue> inner = {GgufValue::array_of<int32_t>(i32s),
                                  GgufValue::array_of_strings({"x", "", "yz"}),
                                  GgufValue::array_of_arrays({GgufValue::array_of<uint8_t>(u8s)})};
  return {
      {"t.u8", GgufValue::of<uint8_t>(200)},
      {"t.i8", GgufValue::of<int8_t>(-100)},
      {"t.u16", GgufValue::of<uint16_t>(60000)},
      {"t.i16", GgufValue::of<int16_t>(-30000)},
      {"t.u32", GgufValue::of<uint32_t>(4000000000u)},
      {"t.i32", GgufValue::of<int32_t>(-2000000000)},
      {"t.f32", GgufValue::of<float>(0.1f)},
      {"t.bool", GgufValue::of<bool>(true)},
      {"t.string", GgufValue::of_string("h\xc3\xa9llo \xe2\x96\x81 world")},
      {"t.empty_string", GgufValue::of_string("")},
      {"t.u64", GgufValue::of<uint64_t>(18446744073709551615ull)},
      {"t.i64", GgufValue::of<int64_t>(-9223372036854775807ll - 1)},
      {"t.f64", GgufValue::of<double>(2.718281828459045)},
      {"a.u8", GgufValue::array_of<uint8_t>(u8s)},
      {"a.i8", GgufValue::array_of<int8_t>(i8s)},
      {"a.u16", GgufValue::array_of<uint16_t>(u16s)},
      {"a.i16", GgufValue::array_of<int16_t>(i16s)},
      {"a.u32", GgufValue::array_of<uint32_t>(u32s)},
      {"a.i32", GgufValue::array_of<int32_t>(i32s)},
      {"a.f32", GgufValue::array_of<float>(f32s)},
      {"a.bool", GgufValue::array_of<bool>(bools)},
      {"a.u64", GgufValue::array_of<uint64_t>(u64s)},
      {"a.i64", GgufValue::array_of<int64_t>(i64s)},
      {"a.f64", GgufValue::array_of<double>(f64s)},
      {"a.string", GgufValue::array_of_strings({"<unk>", "\xe2\x96\x81the", ""})},
      {"a.empty", GgufValue::array_of<float>(std::span<const float>())},
      {"a.nested", GgufValue::array_of_arrays(std::move(inner))},
  };
}

TEST(GgufFileTest, EveryMetadataTypeRoundTripsInOrder) {
  GgufWriter writer;
  const auto entries = every_value_type();
  for (const auto& [key, value] : entries) writer.set(key, value);
  Result<std::vector<uint8_t>> bytes = writer.write_to_buffer();
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  Result<GgufFile> file = GgufFile::parse(*bytes);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->version(), 3u);
  ASSERT_EQ(file->metadata().size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(file->metadata()[i].key, entries[i].first);
    EXPECT_EQ(file->metadata()[i].value, entries[i].second) << entries[i].first;
  }
  EXPECT_TRUE(file->tensors().empty());
}

TEST(GgufFileTest, TypedGettersConvertOnlyWhatFits) {
  GgufWriter writer;
  for (const auto& [key, value] : every_value_type()) writer.set(key, value);
  Result<GgufFile> file = GgufFile::parse_owned(*writer.write_to_buffer(), "test.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(*file->get<uint32_t>("t.u32"), 4000000000u);
  EXPECT_EQ(*file->get_integer("t.u32"), 4000000000ll);
  EXPECT_EQ(*file->get_integer("t.i8"), -100);
  EXPECT_EQ(*file->get_integer("t.i64"), -9223372036854775807ll - 1);
  EXPECT_DOUBLE_EQ(*file->get_floating("t.f32"), 0.1f);
  EXPECT_DOUBLE_EQ(*file->get_floating("t.f64"), 2.718281828459045);
  EXPECT_TRUE(*file->get_bool("t.bool"));
  EXPECT_EQ(*file->get_string("t.empty_string"), "");
  EXPECT_EQ(*file->get_array<int32_t>("a.i32"), (std::vector<int32_t>{-5, 0, 2147483647}));
  EXPECT_EQ(file->get_string_array("a.string")->size(), 3u);

  const Status missing = file->get_integer("llama.block_count").status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("'llama.block_count'"));
  EXPECT_THAT(missing.message(), HasSubstr("test.gguf"));
  const Status wrong = file->get_string("t.u32").status();
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.message(), HasSubstr("'t.u32' is a uint32, expected a string"));
  EXPECT_EQ(file->get<int32_t>("t.u32").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(file->get_integer("t.f32").status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(file->get_integer("t.u64").status().message(), HasSubstr("does not fit in int64"));
  EXPECT_THAT(file->get_array<float>("a.i32").status().message(),
              HasSubstr("is an array of int32, expected array of float32"));
  EXPECT_EQ(file->get_string_array("a.i32").status().code(), StatusCode::kInvalidArgument);
}

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> dimensions;
};

void expect_tensors_round_trip(uint32_t alignment) {
  const std::vector<TensorSpec> specs = {
      {"a.f32", DType::kF32, {3, 5}},         {"b.f16", DType::kF16, {7}},
      {"c.q8_0", DType::kQ8_0, {64, 3}},      {"d.q4_0", DType::kQ4_0, {32, 2, 2}},
      {"e.bf16", DType::kBF16, {1, 1, 1, 3}}, {"f.i32", DType::kI32, {0}},
  };
  GgufWriter writer;
  if (alignment != kGgufDefaultAlignment) writer.set("general.alignment", GgufValue::of(alignment));
  writer.set("general.name", GgufValue::of_string("tensors"));
  std::vector<std::vector<std::byte>> contents;
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t elements = 1;
    for (int64_t extent : specs[i].dimensions) elements *= extent;
    const DTypeInfo info = dtype_info(specs[i].dtype);
    contents.push_back(iota_bytes(elements / info.block_elements * info.block_bytes, i));
    ASSERT_TRUE(
        writer.add_tensor_bytes(specs[i].name, specs[i].dtype, specs[i].dimensions, contents.back())
            .ok());
  }
  Result<std::vector<uint8_t>> bytes = writer.write_to_buffer();
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  Result<GgufFile> file = GgufFile::parse(*bytes);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->alignment(), alignment);
  EXPECT_EQ(file->data_offset() % alignment, 0u);
  ASSERT_EQ(file->tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const GgufTensorInfo& info = file->tensors()[i];
    EXPECT_EQ(info.name, specs[i].name);
    EXPECT_EQ(info.dimensions, specs[i].dimensions);
    EXPECT_EQ(info.offset % alignment, 0u) << info.name;
    Result<GgufTensor> tensor = file->tensor(specs[i].name);
    ASSERT_TRUE(tensor.ok()) << tensor.status().to_string();
    EXPECT_EQ(tensor->dtype, specs[i].dtype);
    EXPECT_EQ(tensor->info, &info);
    ASSERT_EQ(tensor->data.size(), contents[i].size());
    EXPECT_TRUE(std::equal(tensor->data.begin(), tensor->data.end(), contents[i].begin()));
    EXPECT_EQ(static_cast<uint64_t>(tensor->data.data() -
                                    reinterpret_cast<const std::byte*>(bytes->data())) %
                  alignment,
              0u);
  }
  EXPECT_EQ(file->tensor("missing").status().code(), StatusCode::kNotFound);
}

TEST(GgufFileTest, TensorsRoundTripAtDefaultAlignment) {
  expect_tensors_round_trip(32);
}
TEST(GgufFileTest, TensorsRoundTripAtCustomAlignment) {
  expect_tensors_round_trip(256);
}
TEST(GgufFileTest, TensorsRoundTripAtAlignmentOne) {
  expect_tensors_round_trip(1);
}

TEST(GgufFileTest, OpenMapsAWrittenFile) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "folio_gguf_open_test.gguf").string();
  GgufWriter writer;
  writer.set("general.architecture", GgufValue::of_string("llama"));
  ASSERT_TRUE(writer.add_tensor_bytes("w", DType::kF32, {4}, iota_bytes(16, 3)).ok());
  ASSERT_TRUE(writer.write_file(path).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  Result<GgufFile> file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->source(), path);
  EXPECT_EQ(*file->get_string("general.architecture"), "llama");
  GgufFile moved = std::move(*file);  // the mapping moves with the file; spans stay valid
  EXPECT_EQ(moved.tensor("w")->data[1], std::byte{10});
  std::filesystem::remove(path);

  const Status missing = GgufFile::open(path).status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr(path));
}

TEST(GgufFileTest, WriterRejectsMalformedTensors) {
  GgufWriter writer;
  EXPECT_EQ(writer.add_tensor_bytes("", DType::kF32, {1}, iota_bytes(4, 0)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      writer.add_tensor_bytes(std::string(65, 'x'), DType::kF32, {1}, iota_bytes(4, 0)).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.add_tensor_bytes("q", DType::kQ4_0, {16}, iota_bytes(9, 0)).code(),
            StatusCode::kInvalidArgument);  // half a block
  EXPECT_EQ(writer.add_tensor_bytes("r", DType::kF32, {1, 1, 1, 1, 1}, iota_bytes(4, 0)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.add_tensor_bytes("s", DType::kF32, {2}, iota_bytes(4, 0)).code(),
            StatusCode::kInvalidArgument);  // wrong byte count
  ASSERT_TRUE(writer.add_tensor_bytes("t", DType::kF32, {1}, iota_bytes(4, 0)).ok());
  EXPECT_EQ(writer.add_tensor_bytes("t", DType::kF32, {1}, iota_bytes(4, 0)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.tensor_count(), 1u);
  writer.set("general.alignment", GgufValue::of<uint32_t>(48));
  EXPECT_EQ(writer.write_to_buffer().status().code(), StatusCode::kInvalidArgument);
}

TEST(GgufFileTest, TensorOfATypeFolioCannotComputeWithIsReadableButNotLoadable) {
  RawGguf raw;
  raw.header(3, 1, 0).tensor_info("blk.0.ffn_down.weight", {256, 2}, 16 /* iq2_xxs */, 0);
  raw.pad_to(32).zeros(2 * 66);
  Result<GgufFile> file = GgufFile::parse(raw.bytes);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const GgufTensorInfo& info = file->tensors()[0];
  EXPECT_EQ(info.type.name, "iq2_xxs");
  EXPECT_EQ(info.byte_size, 132u);
  EXPECT_EQ(file->tensor_bytes(info).size(), 132u);
  const Status status = file->tensor("blk.0.ffn_down.weight").status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'blk.0.ffn_down.weight' has ggml type iq2_xxs"));
}

}  // namespace
}  // namespace folio::gguf

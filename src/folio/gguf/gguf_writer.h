// GgufWriter: builds a GGUF version 3 file: metadata of any value type and tensors laid out
// back to back, each padded to the file's alignment (`general.alignment`, default 32), which
// is also the layout llama.cpp requires.
//
// Tensor bytes are produced while writing by a caller-supplied fill function, one tensor at a
// time, so writing a model needs memory for its largest tensor, not for the whole model. Used by
// `folio make-model`, by tests, and by tools exporting trained weights.
//
// Thread-safety: not thread-safe while being built; write_file / write_to_buffer are const and
// may run concurrently only if the fill functions allow it.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/gguf/gguf_value.h"
#include "folio/tensor/dtype.h"

namespace folio::gguf {

class GgufWriter {
 public:
  // Writes exactly destination.size() bytes (the tensor's byte size) into destination.
  using TensorFill = std::function<Status(std::span<std::byte> destination)>;

  // Sets a metadata entry; setting an existing key replaces its value in place, so keys keep
  // the order of their first set.
  void set(std::string key, GgufValue value);

  // Adds a tensor of `dtype` with ggml-order dimensions (dimensions[0] is the row length).
  // Errors (kInvalidArgument): empty, over-long (> 64 bytes) or duplicate name; not 1 to 4
  // dimensions; a negative extent; a row length that is not a whole number of dtype blocks; a
  // byte size that overflows.
  Status add_tensor(std::string name, DType dtype, std::vector<int64_t> dimensions,
                    TensorFill fill);
  // As above, with the bytes given up front. Also kInvalidArgument when their size is wrong.
  Status add_tensor_bytes(std::string name, DType dtype, std::vector<int64_t> dimensions,
                          std::vector<std::byte> bytes);

  // Writes to `path` through a temporary file renamed into place, so a failed write never
  // leaves a truncated file under the final name.
  Status write_file(const std::string& path) const;
  Result<std::vector<uint8_t>> write_to_buffer() const;

  size_t tensor_count() const { return tensors_.size(); }

  class Sink;  // where serialized bytes go; defined in gguf_writer.cc

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> dimensions;
    uint64_t byte_size;
    TensorFill fill;
  };
  Status write(Sink& sink) const;
  Result<uint64_t> alignment() const;

  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace folio::gguf

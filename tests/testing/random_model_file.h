// RandomModelFile: a generated Llama model (model::make_random_llama_writer) written to a GGUF
// file of its own temporary directory, with its identity as a worker reports it at the
// handshake ("fnv1a64:<hash of the file's bytes>"): the model on disk of the dist tests and
// benchmarks, where worker processes and services open it by path.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "folio/base/check.h"
#include "folio/base/random.h"
#include "folio/dist/worker_protocol.h"
#include "folio/model/llama_model_file.h"
#include "testing/collective_groups.h"

namespace folio::testing {

struct RandomModelFile {
  TemporaryDirectory directory;
  std::string path;
  dist::ModelIdentity identity;

  RandomModelFile(const model::LlamaShape& shape, uint64_t seed,
                  const std::string& name = "model.gguf") {
    Result<gguf::GgufWriter> writer = model::make_random_llama_writer(shape, seed);
    FOLIO_CHECK(writer.ok(), "{}", writer.status().to_string());
    Result<std::vector<uint8_t>> bytes = writer->write_to_buffer();
    FOLIO_CHECK(bytes.ok(), "{}", bytes.status().to_string());
    path = directory.path() + "/" + name;
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes->data()),
               static_cast<std::streamsize>(bytes->size()));
    identity =
        dist::ModelIdentity{.hash = fmt::format("fnv1a64:{:016x}", fnv1a64(*bytes)), .name = name};
  }
};

}  // namespace folio::testing

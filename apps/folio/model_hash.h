// The identity of a model file as the coordinator and its workers compare it at the handshake
// (dist::ModelIdentity): FNV-1a 64 of the file's bytes, written "fnv1a64:<16 hex digits>".
// It tells files apart, not adversaries (FNV is not a cryptographic hash). Reading streams the
// file once (about 1 GB/s, one multiply per byte); the weight cache of issue 15 will hash per
// tensor instead.
#pragma once

#include <string>

#include "folio/base/result.h"
#include "folio/dist/worker_protocol.h"

namespace folio::app {

// kNotFound when the file cannot be opened, kDataLoss when reading fails midway.
Result<std::string> model_file_hash(const std::string& path);

// The hash and the file's name without its extension.
Result<dist::ModelIdentity> model_identity(const std::string& path);

}  // namespace folio::app

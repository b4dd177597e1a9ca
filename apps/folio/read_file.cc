#include "apps/folio/read_file.h"

#include <fstream>
#include <iterator>

namespace folio::app {

Result<std::string> read_file(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) return not_found("cannot open '{}'", path);
  std::string bytes((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
  if (stream.bad()) return data_loss("error reading '{}'", path);
  return bytes;
}

}  // namespace folio::app

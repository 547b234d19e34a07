#include "io/text_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"

namespace ms {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MS_CHECK(in, "cannot open ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  MS_CHECK(!in.bad(), "cannot read ", path);
  return ss.str();
}

std::optional<std::string> read_text_file_if_exists(const std::string& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  return read_text_file(path);
}

}  // namespace ms

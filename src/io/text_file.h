// Whole-file reads for the small JSON and text files next to a checkpoint.
#pragma once
#include <optional>
#include <string>

namespace ms {

std::string read_text_file(const std::string& path);  // throws naming the path
std::optional<std::string> read_text_file_if_exists(const std::string& path);

}  // namespace ms

// Kernel variants picked by name, so that one binary can time or test each of them: a table of
// {name, launch} whose first entry is the default, a name passed by the caller or else read from
// an environment variable at every call, and an error naming the known ones for a bad name.
#pragma once
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"

namespace ms::cuda {

template <class Launch>
struct KernelVariant {
  std::string_view name;
  Launch launch;
};

// `name`, or when empty the variable `env`, or when unset the table's first entry.
template <class Launch, size_t N>
const KernelVariant<Launch>& variant_named(const KernelVariant<Launch> (&table)[N], std::string_view name,
                                           const char* env, const char* what) {
  if (name.empty()) {
    const char* set = std::getenv(env);
    name = set ? set : table[0].name;
  }
  for (const auto& v : table)
    if (v.name == name) return v;
  std::string known;
  for (const auto& v : table) known.append(" ").append(v.name);
  fail(what, ": no variant '", name, "' (known:", known, ")");
}

template <class Launch, size_t N>
std::vector<std::string> variant_names(const KernelVariant<Launch> (&table)[N]) {
  std::vector<std::string> names;
  for (const auto& v : table) names.emplace_back(v.name);
  return names;
}

}  // namespace ms::cuda

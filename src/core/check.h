// Error handling: every failure is an exception that carries its context (which file,
// tensor or flag), caught at the request or command boundary and printed as one line.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace ms {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class T, class... Rest>
void append(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  append(os, rest...);
}
}  // namespace detail

// Builds a message from any streamable parts: ms::fmt("tensor ", name, " has ", n, " dims").
template <class... Parts>
std::string fmt(const Parts&... parts) {
  std::ostringstream os;
  detail::append(os, parts...);
  return os.str();
}

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw Error(fmt(parts...));
}

}  // namespace ms

// MS_CHECK(cond, parts...) throws ms::Error with the parts when cond is false.
#define MS_CHECK(cond, ...)                     \
  do {                                          \
    if (!(cond)) [[unlikely]] ::ms::fail(__VA_ARGS__); \
  } while (0)

// MS_ASSERT is for internal invariants: the message names the source line.
#define MS_ASSERT(cond)                                                                  \
  do {                                                                                   \
    if (!(cond)) [[unlikely]]                                                            \
      ::ms::fail("internal error: ", #cond, " failed at ", __FILE__, ":", __LINE__); \
  } while (0)

// A request the server refuses: an HTTP status and an OpenAI-style error body
// {"error": {"message", "type", "param", "code"}}. Thrown while parsing or validating a request,
// caught at the route, so one bad request never reaches the engine or harms another.
#pragma once
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "core/check.h"

namespace ms::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type = "invalid_request_error", std::string param = {})
      : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string type_, param_;
};

// A 400 for a bad field; `param` names it.
template <class... Parts>
[[noreturn]] void bad_request(const std::string& param, const Parts&... parts) {
  throw ApiError(400, fmt(parts...), "invalid_request_error", param);
}

// The body of an error response. `code` is the HTTP status, as SGLang reports it.
inline nlohmann::json error_body(int status, const std::string& message, const std::string& type,
                                 const std::string& param = {}) {
  nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}};
  if (!param.empty()) e["param"] = param;
  return {{"error", e}};
}

}  // namespace ms::server

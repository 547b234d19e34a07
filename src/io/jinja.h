// A Jinja2 subset, enough for the chat templates shipped in tokenizer_config.json files
// (DeepSeek-V3, Qwen3 and similar): text with {{ }}, {% if/elif/else %}, {% for %} (loop.*,
// `if` filter, else, break/continue), {% set %} (names, tuples, namespace attributes, blocks),
// {% macro %}, whitespace control, Python-like expressions, the common filters, tests and
// string/dict methods. Rendering follows Python Jinja2 with trim_blocks and lstrip_blocks on,
// as transformers renders chat templates. Anything outside the subset is an error that names
// the template line, never silently different text.
#pragma once
#include <memory>
#include <string>

#include "io/jinja_value.h"

namespace ms::jinja {

struct Program;

class Template {
 public:
  Template(const std::string& source, std::string name);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  // `context` is a dict of the template's variables.
  std::string render(const Value& context) const;

 private:
  std::string name_;
  std::unique_ptr<Program> program_;
};

// Built-ins (jinja_builtins.cpp), used by the renderer.
Value apply_filter(const std::string& name, const Value& v, std::vector<Value>& args, Kwargs& kwargs);
bool apply_test(const std::string& name, const Value& v, std::vector<Value>& args);
// Calls a method of a string, list or dict (`s.startswith("x")`); false when there is none.
bool call_method(const Value& obj, const std::string& name, std::vector<Value>& args, Kwargs& kwargs, Value& out);
// range, namespace, raise_exception, strftime_now.
void add_globals(Object& globals);

}  // namespace ms::jinja

// Values of the Jinja subset used by chat templates: Python semantics (truthiness, equality,
// str(), repr()) over undefined, none, bool, int, float, string, list, dict (insertion order
// kept, as Python's) and callables. Lists and dicts are shared by reference, as in Python.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ms::jinja {

class Value;
using Array = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(std::vector<Value>& args, Kwargs& kwargs)>;

struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace() objects accept `set ns.attr = ...`
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kFunction };

  Value() = default;  // undefined
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(int64_t(i)) {}
  Value(double f);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(Array a);
  Value(std::shared_ptr<Object> o);
  Value(Function f);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_number() const { return kind_ == Kind::kFloat ? f_ : double(i_); }
  const std::string& as_string() const { return *s_; }
  Array& as_array() const { return *a_; }
  Object& as_object() const { return *o_; }
  const std::shared_ptr<Object>& object_ptr() const { return o_; }
  const Function& as_function() const { return *fn_; }

  bool truthy() const;
  std::string str() const;   // Python str(): what {{ value }} prints
  std::string repr() const;  // Python repr(): how a value prints inside a list or dict
  std::string type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<std::string> s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
  std::shared_ptr<Function> fn_;
};

bool equals(const Value& a, const Value& b);  // Python ==
int compare(const Value& a, const Value& b);  // Python <, for numbers and strings; throws otherwise
std::string format_float(double f);           // Python repr(float)

struct JsonOptions {
  int indent = -1;  // < 0: one line
  bool ensure_ascii = false, sort_keys = false;
  std::string item_sep, key_sep;  // empty: Python json.dumps' defaults
};
// Python json.dumps, as transformers' `tojson` filter calls it.
std::string to_json(const Value& v, const JsonOptions& opt);

}  // namespace ms::jinja

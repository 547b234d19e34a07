#include "io/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/check.h"
#include "io/utf8.h"

namespace ms::jinja {

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double f) : kind_(Kind::kFloat), f_(f) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::make_shared<std::string>(std::move(s))) {}
Value::Value(Array a) : kind_(Kind::kArray), a_(std::make_shared<Array>(std::move(a))) {}
Value::Value(std::shared_ptr<Object> o) : kind_(Kind::kObject), o_(std::move(o)) {}
Value::Value(Function f) : kind_(Kind::kFunction), fn_(std::make_shared<Function>(std::move(f))) {}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return none();
    case nlohmann::json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Value(int64_t(j.get<uint64_t>()));
    case nlohmann::json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      Array a;
      for (const auto& e : j) a.push_back(from_json(e));
      return Value(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      auto o = std::make_shared<Object>();
      for (const auto& [k, v] : j.items()) o->items.emplace_back(k, from_json(v));
      return Value(std::move(o));
    }
    default: fail("chat template: cannot use JSON value ", j.dump(), " as a template value");
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0;
    case Kind::kString: return !s_->empty();
    case Kind::kArray: return !a_->empty();
    case Kind::kObject: return !o_->items.empty();
    case Kind::kFunction: return true;
  }
  return false;
}

std::string format_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  // Python repr: shortest round-trip digits, exponent form outside [1e-4, 1e16).
  double a = std::fabs(f);
  bool sci = a != 0 && (a < 1e-4 || a >= 1e16);
  auto r = std::to_chars(buf, buf + sizeof buf, f, sci ? std::chars_format::scientific : std::chars_format::fixed);
  std::string s(buf, r.ptr);
  if (sci) {  // C++ writes 1e-05 as "1e-05" already; Python too. Only "e+0N" differs: "1e+16".
    auto e = s.find('e');
    std::string mant = s.substr(0, e), exp = s.substr(e + 1);
    char sign = exp[0] == '-' ? '-' : '+';
    exp = exp.substr(exp[0] == '-' || exp[0] == '+' ? 1 : 0);
    exp.erase(0, std::min(exp.find_first_not_of('0'), exp.size() - 1));
    if (exp.size() < 2) exp = "0" + exp;
    return mant + "e" + sign + exp;
  }
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

namespace {

std::string repr_string(const std::string& s) {
  char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (uint8_t(c) < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(uint8_t(c)));
      out += buf;
    } else out += c;
  }
  return out + q;
}

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    auto c = uint8_t(s[i]);
    char buf[16];
    if (c == '"' || c == '\\') {
      out += '\\', out += char(c), ++i;
    } else if (c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f') {
      out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b" : "\\f";
      ++i;
    } else if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      out += buf, ++i;
    } else if (c < 0x80 || !ensure_ascii) {
      out += char(c), ++i;
    } else {
      char32_t cp = utf8::next(s, i);
      if (cp >= 0x10000) {  // a surrogate pair, as Python writes it
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", unsigned(0xD800 + (cp >> 10)), unsigned(0xDC00 + (cp & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(cp));
      }
      out += buf;
    }
  }
  out += '"';
}

void json_value(const Value& v, const JsonOptions& opt, int depth, std::string& out) {
  std::string item_sep = !opt.item_sep.empty() ? opt.item_sep : opt.indent >= 0 ? "," : ", ";
  std::string key_sep = !opt.key_sep.empty() ? opt.key_sep : ": ";
  auto newline = [&](int d) {
    if (opt.indent >= 0) out += "\n" + std::string(size_t(opt.indent * d), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      double f = v.as_number();
      out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity") : format_float(f);
      return;
    }
    case Value::Kind::kString: json_string(v.as_string(), opt.ensure_ascii, out); return;
    case Value::Kind::kArray: {
      const Array& a = v.as_array();
      if (a.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_value(a[i], opt, depth + 1, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kObject: {
      auto items = v.as_object().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_string(items[i].first, opt.ensure_ascii, out);
        out += key_sep;
        json_value(items[i].second, opt, depth + 1, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Value::Kind::kFunction: fail("chat template: tojson cannot serialize a function");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& opt) {
  std::string out;
  json_value(v, opt, 0, out);
  return out;
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return format_float(f_);
    case Kind::kString: return *s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kString: return repr_string(*s_);
    case Kind::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < a_->size(); ++i) out += (i ? ", " : "") + (*a_)[i].repr();
      return out + "]";
    }
    case Kind::kObject: {
      std::string out = "{";
      for (size_t i = 0; i < o_->items.size(); ++i)
        out += (i ? ", " : "") + repr_string(o_->items[i].first) + ": " + o_->items[i].second.repr();
      return out + "}";
    }
    case Kind::kFunction: return "<function>";
    default: return str();
  }
}

std::string Value::type_name() const {
  static const char* const kNames[] = {"undefined", "none", "bool", "int", "float", "string", "list", "dict", "function"};
  return kNames[int(kind_)];
}

bool equals(const Value& a, const Value& b) {
  auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  if (numeric(a) && numeric(b)) {
    double x = a.is_bool() ? a.as_bool() : a.as_number(), y = b.is_bool() ? b.as_bool() : b.as_number();
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.as_string() == b.as_string();
    case Value::Kind::kArray: {
      const Array &x = a.as_array(), &y = b.as_array();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    case Value::Kind::kObject: {
      const auto &x = a.as_object().items, &y = b.as_object().items;
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* w = b.as_object().find(k);
        if (!w || !equals(v, *w)) return false;
      }
      return true;
    }
    default: return &a.as_function() == &b.as_function();
  }
}

int compare(const Value& a, const Value& b) {
  auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  if (numeric(a) && numeric(b)) {
    double x = a.is_bool() ? a.as_bool() : a.as_number(), y = b.is_bool() ? b.as_bool() : b.as_number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.as_string().compare(b.as_string()) < 0 ? -1 : a.as_string() == b.as_string() ? 0 : 1;
  if (a.is_array() && b.is_array()) {
    const Array &x = a.as_array(), &y = b.as_array();
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i)
      if (int c = compare(x[i], y[i])) return c;
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail("chat template: cannot compare ", a.type_name(), " with ", b.type_name());
}

}  // namespace ms::jinja

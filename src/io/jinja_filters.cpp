// Jinja2's built-in filters and tests used by chat templates.
#include <algorithm>
#include <cmath>
#include <optional>

#include "core/check.h"
#include "io/jinja.h"
#include "io/utf8.h"

namespace ms::jinja {

namespace {

Value arg(std::vector<Value>& args, Kwargs& kwargs, size_t i, std::string_view name) {
  if (i < args.size()) return args[i];
  for (auto& [k, v] : kwargs)
    if (k == name) return v;
  return Value();
}

bool flag(const Value& v, bool dflt) { return v.is_undefined() ? dflt : v.truthy(); }

Array chars_of(const std::string& s) {
  Array out;
  for (size_t i = 0; i < s.size();) {
    size_t b = i;
    utf8::next(s, i);
    out.emplace_back(s.substr(b, i - b));
  }
  return out;
}

Array as_list(const Value& v, const char* filter) {
  if (v.is_array()) return v.as_array();
  if (v.is_string()) return chars_of(v.as_string());
  if (v.is_object()) {
    Array keys;
    for (const auto& kv : v.as_object().items) keys.emplace_back(kv.first);
    return keys;
  }
  if (v.is_undefined()) return {};
  fail("filter ", filter, " needs a sequence, got ", v.type_name());
}

// An attribute path like "function.name" (Jinja2's make_attrgetter).
Value get_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (cur.is_object()) {
      const Value* next = cur.as_object().find(part);
      cur = next ? *next : Value();
    } else if (cur.is_array() && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      size_t i = std::stoul(part);
      cur = i < cur.as_array().size() ? cur.as_array()[i] : Value();
    } else {
      return Value();
    }
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

Value lowered(const Value& v, bool case_sensitive) {
  std::vector<Value> none;
  Kwargs nokw;
  Value out;
  if (!case_sensitive && v.is_string() && call_method(v, "lower", none, nokw, out)) return out;
  return v;
}

Value filter_tojson(const Value& v, std::vector<Value>& args, Kwargs& kwargs) {
  JsonOptions opt;
  Value indent = arg(args, kwargs, 0, "indent");
  if (indent.is_int()) opt.indent = int(indent.as_int());
  opt.ensure_ascii = flag(arg(args, kwargs, 99, "ensure_ascii"), false);
  opt.sort_keys = flag(arg(args, kwargs, 99, "sort_keys"), false);
  Value seps = arg(args, kwargs, 99, "separators");
  if (seps.is_array()) {
    MS_CHECK(seps.as_array().size() == 2 && seps.as_array()[0].is_string() && seps.as_array()[1].is_string(),
             "tojson: separators must be two strings");
    opt.item_sep = seps.as_array()[0].as_string();
    opt.key_sep = seps.as_array()[1].as_string();
  }
  return Value(to_json(v, opt));
}

Value filter_sort(const Value& v, std::vector<Value>& args, Kwargs& kwargs) {
  Array items = as_list(v, "sort");
  bool reverse = flag(arg(args, kwargs, 0, "reverse"), false);
  bool case_sensitive = flag(arg(args, kwargs, 1, "case_sensitive"), false);
  Value attr = arg(args, kwargs, 2, "attribute");
  auto key = [&](const Value& x) { return lowered(attr.is_string() ? get_path(x, attr.as_string()) : x, case_sensitive); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    int c = compare(key(a), key(b));
    return reverse ? c > 0 : c < 0;
  });
  return Value(std::move(items));
}

Value filter_select(const std::string& name, const Value& v, std::vector<Value>& args, Kwargs& kwargs) {
  bool by_attr = name == "selectattr" || name == "rejectattr";
  bool keep = name == "selectattr" || name == "select";
  Array out;
  size_t t = by_attr ? 1 : 0;
  for (const auto& item : as_list(v, name.c_str())) {
    Value x = by_attr ? get_path(item, args.at(0).str()) : item;
    bool pass;
    if (args.size() > t) {
      std::vector<Value> test_args(args.begin() + std::ptrdiff_t(t) + 1, args.end());
      pass = apply_test(args[t].str(), x, test_args);
    } else {
      pass = x.truthy();
    }
    if (pass == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

Value filter_map(const Value& v, std::vector<Value>& args, Kwargs& kwargs) {
  Array out;
  Value attr = arg(args, kwargs, 99, "attribute");
  for (const auto& item : as_list(v, "map")) {
    if (attr.is_string()) {
      Value x = get_path(item, attr.as_string());
      Value dflt = arg(args, kwargs, 99, "default");
      out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
    } else {
      MS_CHECK(!args.empty() && args[0].is_string(), "map needs a filter name or attribute=");
      std::vector<Value> rest(args.begin() + 1, args.end());
      Kwargs none;
      out.push_back(apply_filter(args[0].as_string(), item, rest, none));
    }
  }
  return Value(std::move(out));
}

Value filter_indent(const Value& v, std::vector<Value>& args, Kwargs& kwargs) {
  const std::string& s = v.as_string();
  Value w = arg(args, kwargs, 0, "width");
  std::string pad = w.is_string() ? w.as_string() : std::string(size_t(w.is_int() ? w.as_int() : 4), ' ');
  bool first = flag(arg(args, kwargs, 1, "first"), false), blank = flag(arg(args, kwargs, 2, "blank"), false);
  std::string out;
  size_t pos = 0;
  for (bool is_first = true;; is_first = false) {
    size_t nl = s.find('\n', pos);
    std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    if ((!is_first || first) && (blank || !line.empty())) out += pad;
    out += line;
    if (nl == std::string::npos) break;
    out += '\n';
    pos = nl + 1;
  }
  return Value(std::move(out));
}

Value filter_number(const std::string& name, const Value& v, std::vector<Value>& args, Kwargs& kwargs) {
  Value dflt = arg(args, kwargs, 0, "default");
  if (name == "int") {
    if (v.is_int()) return v;
    if (v.is_float()) return Value(int64_t(std::trunc(v.as_number())));
    if (v.is_bool()) return Value(int64_t(v.as_bool()));
    try {
      if (v.is_string()) return Value(int64_t(std::stoll(v.as_string())));
    } catch (const std::exception&) {
    }
    return dflt.is_undefined() ? Value(int64_t(0)) : dflt;
  }
  if (v.is_number()) return Value(v.as_number());
  if (v.is_bool()) return Value(double(v.as_bool()));
  try {
    if (v.is_string()) return Value(std::stod(v.as_string()));
  } catch (const std::exception&) {
  }
  return dflt.is_undefined() ? Value(0.0) : dflt;
}

// Filters over lists, strings (as lists of characters) and dicts; nullopt for other names.
std::optional<Value> apply_sequence_filter(const std::string& name, const Value& v, std::vector<Value>& args,
                                           Kwargs& kwargs) {
  Value out;
  std::vector<Value> none;
  Kwargs nokw;
  if (name == "first" || name == "last") {
    Array items = as_list(v, name.c_str());
    return items.empty() ? Value() : name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value(as_list(v, "list"));
  if (name == "reverse") {
    if (v.is_string()) {
      std::string s;
      Array cs = chars_of(v.as_string());
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) s += it->as_string();
      return Value(std::move(s));
    }
    Array items = as_list(v, "reverse");
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "join") {
    Value sep = arg(args, kwargs, 0, "d"), attr = arg(args, kwargs, 1, "attribute");
    std::string s;
    bool first = true;
    for (const auto& item : as_list(v, "join")) {
      if (!first) s += sep.is_undefined() ? "" : sep.str();
      s += (attr.is_string() ? get_path(item, attr.as_string()) : item).str();
      first = false;
    }
    return Value(std::move(s));
  }
  if (name == "sort") return filter_sort(v, args, kwargs);
  if (name == "unique") {
    Array out_items;
    for (const auto& item : as_list(v, "unique"))
      if (std::none_of(out_items.begin(), out_items.end(), [&](const Value& x) { return equals(x, item); }))
        out_items.push_back(item);
    return Value(std::move(out_items));
  }
  if (name == "items" || name == "dictsort") {
    MS_CHECK(v.is_object(), "filter ", name, " needs a dict, got ", v.type_name());
    call_method(v, "items", none, nokw, out);
    if (name == "dictsort") return filter_sort(out, none, nokw);
    return out;
  }
  if (name == "map") return filter_map(v, args, kwargs);
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr")
    return filter_select(name, v, args, kwargs);
  if (name == "min" || name == "max" || name == "sum") {
    Array items = as_list(v, name.c_str());
    if (name == "sum") {
      Value total(int64_t(0));
      for (const auto& x : items) total = total.is_int() && x.is_int() ? Value(total.as_int() + x.as_int())
                                                                       : Value(total.as_number() + x.as_number());
      return total;
    }
    if (items.empty()) return Value();
    auto it = std::min_element(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      return name == "min" ? compare(a, b) < 0 : compare(a, b) > 0;
    });
    return *it;
  }
  return std::nullopt;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& v, std::vector<Value>& args, Kwargs& kwargs) {
  Value out;
  std::vector<Value> none;
  Kwargs nokw;
  if (name == "safe") return v;
  if (name == "tojson") return filter_tojson(v, args, kwargs);
  if (name == "default" || name == "d") {
    bool boolean = flag(arg(args, kwargs, 1, "boolean"), false);
    bool use = v.is_undefined() || (boolean && !v.truthy());
    return use ? (args.empty() ? Value(std::string()) : args[0]) : v;
  }
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value(int64_t(utf8::count_code_points(v.as_string())));
    if (v.is_array()) return Value(int64_t(v.as_array().size()));
    if (v.is_object()) return Value(int64_t(v.as_object().items.size()));
    if (v.is_undefined()) return Value(int64_t(0));
    fail("filter length: a ", v.type_name(), " has no length");
  }
  if (name == "string") return Value(v.str());
  if (name == "int" || name == "float") return filter_number(name, v, args, kwargs);
  if (name == "abs") {
    MS_CHECK(v.is_number(), "filter abs needs a number");
    return v.is_int() ? Value(v.as_int() < 0 ? -v.as_int() : v.as_int()) : Value(std::fabs(v.as_number()));
  }
  if (name == "round") {
    MS_CHECK(v.is_number(), "filter round needs a number");
    Value p = arg(args, kwargs, 0, "precision");
    double scale = std::pow(10.0, p.is_int() ? double(p.as_int()) : 0.0);
    return Value(std::round(v.as_number() * scale) / scale);
  }
  if (name == "trim" || name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
      name == "replace") {
    MS_CHECK(v.is_string(), "filter ", name, " needs a string, got ", v.type_name());
    call_method(v, name == "trim" ? "strip" : name, args, kwargs, out);
    return out;
  }
  if (name == "indent") {
    MS_CHECK(v.is_string(), "filter indent needs a string");
    return filter_indent(v, args, kwargs);
  }
  if (auto seq = apply_sequence_filter(name, v, args, kwargs)) return *seq;
  fail("unsupported filter '", name, "'");
}

bool apply_test(const std::string& name, const Value& v, std::vector<Value>& args) {
  auto need_arg = [&]() -> const Value& {
    MS_CHECK(!args.empty(), "test '", name, "' needs an argument");
    return args[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "iterable") return v.is_array() || v.is_string() || v.is_object();
  if (name == "sequence") return v.is_array() || v.is_string() || v.is_object();
  if (name == "callable") return v.is_function();
  if (name == "odd" || name == "even") {
    MS_CHECK(v.is_int(), "test '", name, "' needs an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") return v.is_int() && need_arg().is_int() && v.as_int() % need_arg().as_int() == 0;
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, need_arg());
  if (name == "ne" || name == "!=") return !equals(v, need_arg());
  if (name == "lt" || name == "<") return compare(v, need_arg()) < 0;
  if (name == "gt" || name == ">") return compare(v, need_arg()) > 0;
  if (name == "le" || name == "<=") return compare(v, need_arg()) <= 0;
  if (name == "ge" || name == ">=") return compare(v, need_arg()) >= 0;
  if (name == "in") {
    const Value& c = need_arg();
    if (c.is_string()) return v.is_string() && c.as_string().find(v.as_string()) != std::string::npos;
    if (c.is_object()) return v.is_string() && c.as_object().find(v.as_string());
    return c.is_array() && std::any_of(c.as_array().begin(), c.as_array().end(), [&](const Value& x) { return equals(v, x); });
  }
  if (name == "sameas") {
    const Value& o = need_arg();
    return v.kind() == o.kind() && (v.is_none() || v.is_undefined() || (v.is_bool() && v.as_bool() == o.as_bool()) ||
                                    (!v.is_bool() && equals(v, o)));
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    std::vector<Value> none;
    Kwargs nokw;
    Value out;
    call_method(v, name, none, nokw, out);
    return out.as_string() == v.as_string();
  }
  fail("unsupported test '", name, "'");
}

}  // namespace ms::jinja

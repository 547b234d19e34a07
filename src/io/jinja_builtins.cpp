// Filters, tests, string/list/dict methods and global functions of the Jinja subset, with the
// behaviour of Python Jinja2 (and of transformers' own `tojson` and `raise_exception`).
#include <algorithm>
#include <ctime>
#include <utf8proc.h>

#include "core/check.h"
#include "io/jinja.h"
#include "io/utf8.h"

namespace ms::jinja {

namespace {

const Value* kwarg(Kwargs& kwargs, std::string_view name) {
  for (auto& [k, v] : kwargs)
    if (k == name) return &v;
  return nullptr;
}

// Positional argument i, else keyword `name`, else undefined.
Value arg(std::vector<Value>& args, Kwargs& kwargs, size_t i, std::string_view name) {
  if (i < args.size()) return args[i];
  const Value* v = kwarg(kwargs, name);
  return v ? *v : Value();
}

const std::string& need_string(const Value& v, const char* what) {
  MS_CHECK(v.is_string(), what, " needs a string, got ", v.type_name());
  return v.as_string();
}

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python str.strip/lstrip/rstrip: whitespace, or the characters of `chars` when given.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::u32string set;
  bool ws = chars.is_undefined() || chars.is_none();
  if (!ws)
    for (size_t i = 0; i < need_string(chars, "strip()").size();) set += utf8::next(chars.as_string(), i);
  auto drop = [&](char32_t c) { return ws ? is_py_space(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = s.size();
  while (left && b < e) {
    size_t j = b;
    if (!drop(utf8::next(s, j))) break;
    b = j;
  }
  while (right && e > b) {
    size_t j = e;
    if (!drop(utf8::prev(s, j))) break;
    e = j;
  }
  return s.substr(b, e - b);
}

std::string map_case(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 title, 3 capitalize
  std::string out;
  bool word_start = true, first = true;
  for (size_t i = 0; i < s.size();) {
    auto cp = utf8proc_int32_t(utf8::next(s, i));
    bool upper = mode == 1 || (mode == 2 && word_start) || (mode == 3 && first);
    utf8::append(out, char32_t(upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp)));
    auto cat = utf8proc_category(cp);
    word_start = !(cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO);
    first = false;
  }
  return out;
}

Array split(const std::string& s, const Value& sep, int64_t maxsplit) {
  Array out;
  if (sep.is_undefined() || sep.is_none()) {  // runs of whitespace, no empty strings
    size_t i = 0;
    auto skip = [&](bool space) {  // moves i past characters whose is-space equals `space`
      while (i < s.size()) {
        size_t j = i;
        if (is_py_space(utf8::next(s, j)) != space) break;
        i = j;
      }
    };
    skip(true);
    while (i < s.size()) {
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        out.emplace_back(s.substr(i));
        break;
      }
      size_t begin = i;
      skip(false);
      out.emplace_back(s.substr(begin, i - begin));
      skip(true);
    }
    return out;
  }
  const std::string& d = need_string(sep, "split()");
  MS_CHECK(!d.empty(), "split(): empty separator");
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(d, pos);
    if (hit == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + d.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    size_t hit = from.empty() ? (pos <= s.size() ? pos : std::string::npos) : s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    if (from.empty()) {  // Python inserts between characters
      if (hit >= s.size()) {
        pos = s.size() + 1;
        break;
      }
      size_t j = hit;
      utf8::next(s, j);
      out.append(s, hit, j - hit);
      pos = j;
    } else {
      pos = hit + from.size();
    }
  }
  if (pos <= s.size()) out.append(s, pos, std::string::npos);
  return out;
}

bool string_method(const std::string& s, const std::string& name, std::vector<Value>& args, Kwargs& kwargs,
                   Value& out) {
  auto prefix_test = [&](bool start) {
    Value p = arg(args, kwargs, 0, "prefix");
    auto test = [&](const std::string& x) {
      return x.size() <= s.size() && (start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0);
    };
    if (p.is_array()) {
      for (const auto& x : p.as_array())
        if (test(need_string(x, "startswith()/endswith()"))) return true;
      return false;
    }
    return test(need_string(p, "startswith()/endswith()"));
  };
  if (name == "startswith") out = Value(prefix_test(true));
  else if (name == "endswith") out = Value(prefix_test(false));
  else if (name == "strip") out = Value(strip(s, arg(args, kwargs, 0, "chars"), true, true));
  else if (name == "lstrip") out = Value(strip(s, arg(args, kwargs, 0, "chars"), true, false));
  else if (name == "rstrip") out = Value(strip(s, arg(args, kwargs, 0, "chars"), false, true));
  else if (name == "split") {
    Value m = arg(args, kwargs, 1, "maxsplit");
    out = Value(split(s, arg(args, kwargs, 0, "sep"), m.is_int() ? m.as_int() : -1));
  } else if (name == "replace") {
    Value c = arg(args, kwargs, 2, "count");
    out = Value(replace(s, need_string(arg(args, kwargs, 0, "old"), "replace()"),
                        need_string(arg(args, kwargs, 1, "new"), "replace()"), c.is_int() ? c.as_int() : -1));
  } else if (name == "upper") out = Value(map_case(s, 1));
  else if (name == "lower") out = Value(map_case(s, 0));
  else if (name == "title") out = Value(map_case(s, 2));
  else if (name == "capitalize") out = Value(map_case(s, 3));
  else if (name == "find" || name == "count") {
    const std::string& sub = need_string(arg(args, kwargs, 0, "sub"), "find()/count()");
    if (name == "find") {
      size_t hit = s.find(sub);
      out = Value(hit == std::string::npos ? int64_t(-1) : int64_t(utf8::count_code_points(s.substr(0, hit))));
    } else {
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos && !sub.empty(); p = s.find(sub, p + sub.size())) ++n;
      out = Value(n);
    }
  } else if (name == "isdigit" || name == "isalpha" || name == "isspace") {
    bool ok = !s.empty();
    for (size_t i = 0; i < s.size() && ok;) {
      auto cp = utf8::next(s, i);
      auto cat = utf8proc_category(utf8proc_int32_t(cp));
      ok = name == "isdigit" ? cat == UTF8PROC_CATEGORY_ND
           : name == "isalpha" ? (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO)
                               : is_py_space(cp);
    }
    out = Value(ok);
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool call_method(const Value& obj, const std::string& name, std::vector<Value>& args, Kwargs& kwargs, Value& out) {
  if (obj.is_string()) return string_method(obj.as_string(), name, args, kwargs, out);
  if (obj.is_object()) {
    const auto& items = obj.as_object().items;
    if (name == "items" || name == "keys" || name == "values") {
      Array a;
      for (const auto& [k, v] : items)
        a.push_back(name == "items" ? Value(Array{Value(k), v}) : name == "keys" ? Value(k) : v);
      out = Value(std::move(a));
      return true;
    }
    if (name == "get") {
      Value key = arg(args, kwargs, 0, "key");
      const Value* v = key.is_string() ? obj.as_object().find(key.as_string()) : nullptr;
      Value dflt = arg(args, kwargs, 1, "default");
      out = v ? *v : dflt.is_undefined() ? Value::none() : dflt;
      return true;
    }
    return false;
  }
  if (obj.is_array() && name == "append") {
    MS_CHECK(args.size() == 1, "append() takes one argument");
    obj.as_array().push_back(args[0]);
    out = Value::none();
    return true;
  }
  return false;
}

void add_globals(Object& globals) {
  globals.set("range", Value(Function([](std::vector<Value>& args, Kwargs&) {
    MS_CHECK(!args.empty() && args.size() <= 3, "range() takes 1 to 3 integer arguments");
    for (const auto& a : args) MS_CHECK(a.is_int(), "range() arguments must be integers");
    int64_t start = args.size() > 1 ? args[0].as_int() : 0, stop = args.size() > 1 ? args[1].as_int() : args[0].as_int();
    int64_t step = args.size() > 2 ? args[2].as_int() : 1;
    MS_CHECK(step != 0, "range() step must not be zero");
    Array out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
    return Value(std::move(out));
  })));
  globals.set("namespace", Value(Function([](std::vector<Value>& args, Kwargs& kwargs) {
    auto ns = std::make_shared<Object>();
    ns->is_namespace = true;
    for (const auto& a : args) {
      MS_CHECK(a.is_object(), "namespace() takes a dict or keyword arguments");
      for (const auto& [k, v] : a.as_object().items) ns->set(k, v);
    }
    for (const auto& [k, v] : kwargs) ns->set(k, v);
    return Value(std::move(ns));
  })));
  globals.set("raise_exception", Value(Function([](std::vector<Value>& args, Kwargs&) -> Value {
    fail("the template raised an exception: ", args.empty() ? std::string() : args[0].str());
  })));
  globals.set("strftime_now", Value(Function([](std::vector<Value>& args, Kwargs&) {
    MS_CHECK(args.size() == 1 && args[0].is_string(), "strftime_now() takes a format string");
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, args[0].as_string().c_str(), &tm);
    return Value(std::string(buf, n));
  })));
}

}  // namespace ms::jinja

// The renderer: statements write to an output string; expressions evaluate to Values with
// Python Jinja2 semantics. Errors are rethrown once with the template name and line.
#include <cmath>

#include "core/check.h"
#include "io/jinja.h"
#include "io/jinja_ast.h"
#include "io/utf8.h"

namespace ms::jinja {

struct Program {
  Body body;
};

namespace {

class LocatedError : public Error {
 public:
  using Error::Error;
};

struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* find(std::string_view name) const {
    for (const Scope* s = this; s; s = s->parent)
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};

enum class Flow { kNormal, kBreak, kContinue };

std::vector<Value> split_chars(const std::string& s) {
  std::vector<Value> out;
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    utf8::next(s, i);
    out.emplace_back(s.substr(start, i - start));
  }
  return out;
}

// Python's slice semantics (negative indices, clamping, negative steps) over n elements.
std::vector<size_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step) {
  auto get = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    MS_CHECK(v.is_int(), "slice ", what, " must be an integer, got ", v.type_name());
    return v.as_int();
  };
  int64_t st = get(step, "step").value_or(1);
  MS_CHECK(st != 0, "slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x < 0 ? *x + n : *x;
    return st > 0 ? std::clamp<int64_t>(v, 0, n) : std::clamp<int64_t>(v, -1, n - 1);
  };
  int64_t b = clamp(get(start, "start"), st > 0 ? 0 : n - 1), e = clamp(get(stop, "stop"), st > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(size_t(i));
  return out;
}

class Renderer {
 public:
  explicit Renderer(const std::string& name) : name_(name) {}
  Flow exec(const Body& body, Scope& scope, std::string& out);

 private:
  Flow exec_stmt(const Stmt& s, Scope& scope, std::string& out);
  Flow exec_for(const Stmt& s, Scope& scope, std::string& out);
  void assign(const Expr& target, Value v, Scope& scope);
  Value make_macro(const Stmt& s, Scope& scope);
  Value eval(const Expr& e, Scope& scope);
  Value eval_binary(const std::string& op, const Value& a, const Value& b);
  Value eval_call(const Expr& e, Scope& scope);
  Value eval_member(const Expr& e, Scope& scope);
  void eval_args(const Expr& e, Scope& scope, std::vector<Value>& args, Kwargs& kwargs);
  static std::string describe(const Expr& e) { return e.kind == Expr::Kind::kName ? "'" + e.name + "'" : "the value"; }

  const std::string& name_;
};

Flow Renderer::exec(const Body& body, Scope& scope, std::string& out) {
  for (const auto& s : body) {
    Flow f = exec_stmt(*s, scope, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Flow Renderer::exec_stmt(const Stmt& s, Scope& scope, std::string& out) {
  try {
    switch (s.kind) {
      case Stmt::Kind::kText: out += s.text; return Flow::kNormal;
      case Stmt::Kind::kOutput: out += eval(*s.expr, scope).str(); return Flow::kNormal;
      case Stmt::Kind::kIf: return exec(eval(*s.expr, scope).truthy() ? s.body : s.else_body, scope, out);
      case Stmt::Kind::kFor: return exec_for(s, scope, out);
      case Stmt::Kind::kSet: assign(*s.target, eval(*s.expr, scope), scope); return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        exec(s.body, scope, captured);
        assign(*s.target, Value(std::move(captured)), scope);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro: scope.set(s.name, make_macro(s, scope)); return Flow::kNormal;
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
    }
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& e) {
    throw LocatedError(fmt("chat template ", name_, ", line ", s.line, ": ", e.what()));
  }
  return Flow::kNormal;
}

Flow Renderer::exec_for(const Stmt& s, Scope& scope, std::string& out) {
  Value iterable = eval(*s.expr, scope);
  std::vector<Value> items;
  if (iterable.is_array()) items = iterable.as_array();
  else if (iterable.is_object())
    for (const auto& kv : iterable.as_object().items) items.emplace_back(kv.first);
  else if (iterable.is_string()) items = split_chars(iterable.as_string());
  else if (!iterable.is_undefined()) fail("cannot loop over a ", iterable.type_name());
  Scope loop_scope{&scope, {}};
  if (s.filter) {  // `for x in xs if cond`: loop.* counts only the kept items
    std::vector<Value> kept;
    for (auto& item : items) {
      assign(*s.target, item, loop_scope);
      if (eval(*s.filter, loop_scope).truthy()) kept.push_back(item);
    }
    items.swap(kept);
  }
  const auto n = int64_t(items.size());
  for (int64_t i = 0; i < n; ++i) {
    auto loop = std::make_shared<Object>();
    loop->items = {{"index", Value(i + 1)},     {"index0", Value(i)},          {"revindex", Value(n - i)},
                   {"revindex0", Value(n - i - 1)}, {"first", Value(i == 0)}, {"last", Value(i == n - 1)},
                   {"length", Value(n)},
                   {"previtem", i > 0 ? items[size_t(i - 1)] : Value()},
                   {"nextitem", i + 1 < n ? items[size_t(i + 1)] : Value()}};
    loop->items.emplace_back("cycle", Value(Function([i](std::vector<Value>& args, Kwargs&) {
                               MS_CHECK(!args.empty(), "loop.cycle() needs at least one value");
                               return args[size_t(i) % args.size()];
                             })));
    loop_scope.set("loop", Value(std::move(loop)));
    assign(*s.target, items[size_t(i)], loop_scope);
    if (exec(s.body, loop_scope, out) == Flow::kBreak) break;
  }
  if (n == 0) exec(s.else_body, loop_scope, out);
  return Flow::kNormal;
}

void Renderer::assign(const Expr& target, Value v, Scope& scope) {
  if (target.kind == Expr::Kind::kName) {
    scope.set(target.name, std::move(v));
  } else if (target.kind == Expr::Kind::kAttr) {
    Value obj = eval(*target.a, scope);
    MS_CHECK(obj.is_object() && obj.as_object().is_namespace, "cannot set attribute '", target.name, "' of ",
             describe(*target.a), ": only namespace() objects take attribute assignment");
    obj.as_object().set(target.name, std::move(v));
  } else {
    MS_CHECK(v.is_array(), "cannot unpack a ", v.type_name(), " into ", target.items.size(), " names");
    MS_CHECK(v.as_array().size() == target.items.size(), "cannot unpack ", v.as_array().size(), " values into ",
             target.items.size(), " names");
    for (size_t i = 0; i < target.items.size(); ++i) assign(*target.items[i], v.as_array()[i], scope);
  }
}

Value Renderer::make_macro(const Stmt& s, Scope& scope) {
  const Stmt* def = &s;
  Scope* outer = &scope;
  return Value(Function([this, def, outer](std::vector<Value>& args, Kwargs& kwargs) {
    MS_CHECK(args.size() <= def->params.size(), "macro ", def->name, " takes at most ", def->params.size(),
             " arguments");
    Scope local{outer, {}};
    for (size_t i = 0; i < def->params.size(); ++i) {
      const auto& [pname, dflt] = def->params[i];
      Value v;
      if (i < args.size()) v = args[i];
      for (auto& [k, kv] : kwargs)
        if (k == pname) v = kv;
      if (v.is_undefined() && dflt) v = eval(*dflt, local);
      local.set(pname, v);
    }
    std::string out;
    exec(def->body, local, out);
    return Value(std::move(out));
  }));
}

void Renderer::eval_args(const Expr& e, Scope& scope, std::vector<Value>& args, Kwargs& kwargs) {
  for (const auto& a : e.items) args.push_back(eval(*a, scope));
  for (const auto& [k, v] : e.kwargs) kwargs.emplace_back(k, eval(*v, scope));
}

Value Renderer::eval_call(const Expr& e, Scope& scope) {
  std::vector<Value> args;
  Kwargs kwargs;
  if (e.a->kind == Expr::Kind::kAttr) {
    Value obj = eval(*e.a->a, scope);
    MS_CHECK(!obj.is_undefined(), describe(*e.a->a), " is undefined (calling .", e.a->name, ")");
    eval_args(e, scope, args, kwargs);
    Value out;
    if (!obj.is_object() || !obj.as_object().find(e.a->name)) {
      if (call_method(obj, e.a->name, args, kwargs, out)) return out;
      fail(obj.type_name(), " has no method '", e.a->name, "'");
    }
  }
  Value fn = eval(*e.a, scope);
  MS_CHECK(fn.is_function(), describe(*e.a), " is not callable (it is ", fn.type_name(), ")");
  if (args.empty() && kwargs.empty()) eval_args(e, scope, args, kwargs);
  return fn.as_function()(args, kwargs);
}

Value Renderer::eval_member(const Expr& e, Scope& scope) {
  Value obj = eval(*e.a, scope);
  if (obj.is_undefined()) {
    fail(describe(*e.a), " is undefined (reading ", e.kind == Expr::Kind::kAttr ? "." + e.name : std::string("[...]"),
         ")");
  }
  if (e.kind == Expr::Kind::kSlice) {
    Value start = e.b ? eval(*e.b, scope) : Value(), stop = e.c ? eval(*e.c, scope) : Value();
    Value step = e.step ? eval(*e.step, scope) : Value();
    if (obj.is_array()) {
      Array out;
      for (size_t i : slice_indices(int64_t(obj.as_array().size()), start, stop, step)) out.push_back(obj.as_array()[i]);
      return Value(std::move(out));
    }
    MS_CHECK(obj.is_string(), "cannot slice a ", obj.type_name());
    auto chars = split_chars(obj.as_string());
    std::string out;
    for (size_t i : slice_indices(int64_t(chars.size()), start, stop, step)) out += chars[i].as_string();
    return Value(std::move(out));
  }
  Value key = e.kind == Expr::Kind::kAttr ? Value(e.name) : eval(*e.b, scope);
  if (obj.is_object() && key.is_string()) {
    const Value* v = obj.as_object().find(key.as_string());
    return v ? *v : Value();
  }
  if ((obj.is_array() || obj.is_string()) && key.is_int()) {
    auto items = obj.is_array() ? obj.as_array() : split_chars(obj.as_string());
    int64_t i = key.as_int() < 0 ? key.as_int() + int64_t(items.size()) : key.as_int();
    return i >= 0 && i < int64_t(items.size()) ? items[size_t(i)] : Value();
  }
  return Value();  // Jinja2: a missing attribute is undefined
}

Value Renderer::eval(const Expr& e, Scope& scope) {
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.literal;
    case Expr::Kind::kName: {
      const Value* v = scope.find(e.name);
      return v ? *v : Value();
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      Array a;
      for (const auto& item : e.items) a.push_back(eval(*item, scope));
      return Value(std::move(a));
    }
    case Expr::Kind::kDict: {
      auto o = std::make_shared<Object>();
      for (const auto& [k, v] : e.entries) {
        Value key = eval(*k, scope);
        MS_CHECK(key.is_string(), "dict keys must be strings, got ", key.type_name());
        o->set(key.as_string(), eval(*v, scope));
      }
      return Value(std::move(o));
    }
    case Expr::Kind::kAttr:
    case Expr::Kind::kIndex:
    case Expr::Kind::kSlice: return eval_member(e, scope);
    case Expr::Kind::kCall: return eval_call(e, scope);
    case Expr::Kind::kFilter: {
      Value v = eval(*e.a, scope);
      std::vector<Value> args;
      Kwargs kwargs;
      eval_args(e, scope, args, kwargs);
      return apply_filter(e.name, v, args, kwargs);
    }
    case Expr::Kind::kTest: {
      Value v = eval(*e.a, scope);
      std::vector<Value> args;
      Kwargs kwargs;
      eval_args(e, scope, args, kwargs);
      return Value(apply_test(e.name, v, args) != e.negated);
    }
    case Expr::Kind::kUnary: {
      Value v = eval(*e.a, scope);
      MS_CHECK(v.is_number() || v.is_bool(), "unary ", e.name, " needs a number, got ", v.type_name());
      if (e.name == "+") return v;
      return v.is_float() ? Value(-v.as_number()) : Value(-(v.is_bool() ? int64_t(v.as_bool()) : v.as_int()));
    }
    case Expr::Kind::kAnd: {
      Value a = eval(*e.a, scope);
      return a.truthy() ? eval(*e.b, scope) : a;
    }
    case Expr::Kind::kOr: {
      Value a = eval(*e.a, scope);
      return a.truthy() ? a : eval(*e.b, scope);
    }
    case Expr::Kind::kNot: return Value(!eval(*e.a, scope).truthy());
    case Expr::Kind::kTernary:
      if (eval(*e.b, scope).truthy()) return eval(*e.a, scope);
      return e.c ? eval(*e.c, scope) : Value();
    case Expr::Kind::kBinary: {
      Value a = eval(*e.a, scope);
      return eval_binary(e.name, a, eval(*e.b, scope));
    }
  }
  fail("internal error: unknown expression");
}

Value Renderer::eval_binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Value(equals(a, b));
  if (op == "!=") return Value(!equals(a, b));
  if (op == "~") return Value(a.str() + b.str());
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      MS_CHECK(a.is_string(), "'in <string>' needs a string on the left, got ", a.type_name());
      found = b.as_string().find(a.as_string()) != std::string::npos;
    } else if (b.is_array()) {
      for (const auto& x : b.as_array()) found = found || equals(a, x);
    } else if (b.is_object()) {
      found = a.is_string() && b.as_object().find(a.as_string());
    } else {
      MS_CHECK(b.is_undefined(), "'in' needs a string, list or dict on the right, got ", b.type_name());
    }
    return Value(op == "in" ? found : !found);
  }
  if (op == "<") return Value(compare(a, b) < 0);
  if (op == ">") return Value(compare(a, b) > 0);
  if (op == "<=") return Value(compare(a, b) <= 0);
  if (op == ">=") return Value(compare(a, b) >= 0);
  if (op == "+" && a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
  if (op == "+" && a.is_array() && b.is_array()) {
    Array out = a.as_array();
    out.insert(out.end(), b.as_array().begin(), b.as_array().end());
    return Value(std::move(out));
  }
  if (op == "*" && (a.is_string() || a.is_array()) && b.is_int()) {
    if (a.is_string()) {
      std::string out;
      for (int64_t i = 0; i < b.as_int(); ++i) out += a.as_string();
      return Value(std::move(out));
    }
    Array out;
    for (int64_t i = 0; i < b.as_int(); ++i) out.insert(out.end(), a.as_array().begin(), a.as_array().end());
    return Value(std::move(out));
  }
  auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  MS_CHECK(numeric(a) && numeric(b), "unsupported operand types for ", op, ": ", a.type_name(), " and ",
           b.type_name());
  bool ints = !a.is_float() && !b.is_float();
  auto as_i = [](const Value& v) { return v.is_bool() ? int64_t(v.as_bool()) : v.as_int(); };
  double x = a.is_bool() ? a.as_bool() : a.as_number(), y = b.is_bool() ? b.as_bool() : b.as_number();
  if (op == "+") return ints ? Value(as_i(a) + as_i(b)) : Value(x + y);
  if (op == "-") return ints ? Value(as_i(a) - as_i(b)) : Value(x - y);
  if (op == "*") return ints ? Value(as_i(a) * as_i(b)) : Value(x * y);
  MS_CHECK(op == "**" || y != 0, "division by zero");
  if (op == "/") return Value(x / y);
  if (op == "//") return ints ? Value(int64_t(std::floor(x / y))) : Value(std::floor(x / y));
  if (op == "%") {
    if (ints) {
      int64_t r = as_i(a) % as_i(b);
      return Value(r != 0 && ((r < 0) != (as_i(b) < 0)) ? r + as_i(b) : r);
    }
    double r = std::fmod(x, y);
    return Value(r != 0 && ((r < 0) != (y < 0)) ? r + y : r);
  }
  if (op == "**") return ints && as_i(b) >= 0 ? Value(int64_t(std::llround(std::pow(x, y)))) : Value(std::pow(x, y));
  fail("unknown operator ", op);
}

}  // namespace

Template::Template(const std::string& source, std::string name) : name_(std::move(name)) {
  std::vector<Token> tokens;
  try {
    tokens = tokenize(source);
  } catch (const Error& e) {
    fail("chat template ", name_, ": syntax error: ", e.what());
  }
  program_ = std::make_unique<Program>();
  program_->body = parse(tokens, name_);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& context) const {
  MS_CHECK(context.is_object(), "chat template ", name_, ": the context must be a dict");
  Scope globals;
  Object builtins;
  add_globals(builtins);
  globals.vars = builtins.items;
  Scope vars{&globals, context.as_object().items};
  std::string out;
  Renderer renderer(name_);
  renderer.exec(program_->body, vars, out);
  return out;
}

}  // namespace ms::jinja

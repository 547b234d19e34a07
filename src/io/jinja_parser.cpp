// Recursive-descent parser with Jinja2's operator precedence:
//   ternary < or < and < not < comparisons/in < ~ < + - < * / // % < ** < unary - + < postfix
// where postfix is .attr, [index], [a:b:c], (call), |filter and `is` tests.
#include "core/check.h"
#include "io/jinja_ast.h"

namespace ms::jinja {

namespace {

using T = Token::Type;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : toks_(tokens) {}
  Body parse_all();

 private:
  const Token& peek(size_t ahead = 0) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  const Token& next() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }
  bool at_op(const char* op) const { return peek().type == T::kOperator && peek().text == op; }
  bool at_name(const char* name) const { return peek().type == T::kName && peek().text == name; }
  bool accept_op(const char* op) { return at_op(op) ? (next(), true) : false; }
  bool accept_name(const char* name) { return at_name(name) ? (next(), true) : false; }
  [[noreturn]] void error(const std::string& msg) const { fail("line ", peek().line, ": ", msg); }
  void expect_op(const char* op) {
    if (!accept_op(op)) error(std::string("expected '") + op + "', found " + describe(peek()));
  }
  void expect(T type, const char* what) {
    if (peek().type != type) error(std::string("expected ") + what + ", found " + describe(peek()));
    next();
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case T::kEnd: return "the end of the template";
      case T::kCloseStatement: return "'%}'";
      case T::kCloseExpression: return "'}}'";
      case T::kText: return "text";
      default: return "'" + t.text + "'";
    }
  }
  ExprPtr make(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = peek().line;
    return e;
  }
  ExprPtr binary(Expr::Kind k, std::string op, ExprPtr a, ExprPtr b) {
    auto e = make(k);
    e->name = std::move(op), e->a = std::move(a), e->b = std::move(b);
    return e;
  }

  // Statements.
  Body parse_until(std::initializer_list<const char*> ends, std::string& found);
  StmtPtr parse_statement();
  StmtPtr parse_if();
  StmtPtr parse_for();
  StmtPtr parse_set();
  StmtPtr parse_macro();

  // Expressions.
  ExprPtr parse_expression(bool ternary = true);
  ExprPtr parse_tuple(bool ternary);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_concat();
  ExprPtr parse_math1();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter = true);
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_filters(ExprPtr e);
  ExprPtr parse_primary();
  void parse_args(Expr& call);

  const std::vector<Token>& toks_;
  size_t pos_ = 0;
};

Body Parser::parse_all() {
  std::string found;
  Body body = parse_until({}, found);
  if (peek().type != T::kEnd) error("unexpected " + describe(peek()));
  return body;
}

// Parses statements until `{% <one of ends> ...` (left unconsumed after the name) or the end.
Body Parser::parse_until(std::initializer_list<const char*> ends, std::string& found) {
  Body body;
  while (peek().type != T::kEnd) {
    const Token& t = peek();
    if (t.type == T::kText) {
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Kind::kText, s->line = t.line, s->text = t.text;
      body.push_back(std::move(s));
      next();
    } else if (t.type == T::kOpenExpression) {
      next();
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Kind::kOutput, s->line = t.line, s->expr = parse_expression();
      expect(T::kCloseExpression, "'}}'");
      body.push_back(std::move(s));
    } else if (t.type == T::kOpenStatement) {
      for (const char* end : ends)
        if (peek(1).type == T::kName && peek(1).text == end) {
          next();
          found = next().text;
          return body;
        }
      next();
      if (auto s = parse_statement()) body.push_back(std::move(s));
    } else {
      error("unexpected " + describe(t));
    }
  }
  if (ends.size() > 0) {
    std::string names;
    for (const char* e : ends) names += (names.empty() ? "" : " or ") + std::string(e);
    error("missing {% " + names + " %}");
  }
  return body;
}

StmtPtr Parser::parse_statement() {
  if (peek().type != T::kName) error("expected a tag name after {%");
  std::string tag = next().text;
  int line = peek().line;
  StmtPtr s;
  if (tag == "if") s = parse_if();
  else if (tag == "for") s = parse_for();
  else if (tag == "set") s = parse_set();
  else if (tag == "macro") s = parse_macro();
  else if (tag == "break" || tag == "continue") {
    s = std::make_unique<Stmt>();
    s->kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
    expect(T::kCloseStatement, "'%}'");
  } else if (tag == "generation" || tag == "endgeneration") {  // transformers' assistant-mask markers
    expect(T::kCloseStatement, "'%}'");
    return nullptr;
  } else {
    fail("line ", line, ": unsupported tag {% ", tag, " %}");
  }
  s->line = line;
  return s;
}

StmtPtr Parser::parse_if() {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kIf;
  s->expr = parse_expression();
  expect(T::kCloseStatement, "'%}'");
  std::string found;
  s->body = parse_until({"elif", "else", "endif"}, found);
  if (found == "elif") {
    s->else_body.push_back(parse_if());
    return s;
  }
  if (found == "else") {
    expect(T::kCloseStatement, "'%}'");
    s->else_body = parse_until({"endif"}, found);
  }
  expect(T::kCloseStatement, "'%}'");
  return s;
}

StmtPtr Parser::parse_for() {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kFor;
  auto target = make(Expr::Kind::kTuple);
  do {
    if (peek().type != T::kName) error("expected a loop variable name");
    auto n = make(Expr::Kind::kName);
    n->name = next().text;
    target->items.push_back(std::move(n));
  } while (accept_op(","));
  s->target = target->items.size() == 1 ? std::move(target->items[0]) : std::move(target);
  if (!accept_name("in")) error("expected 'in' in a for loop");
  s->expr = parse_tuple(false);
  if (accept_name("if")) s->filter = parse_expression(false);
  if (at_name("recursive")) error("recursive for loops are not supported");
  expect(T::kCloseStatement, "'%}'");
  std::string found;
  s->body = parse_until({"else", "endfor"}, found);
  if (found == "else") {
    expect(T::kCloseStatement, "'%}'");
    s->else_body = parse_until({"endfor"}, found);
  }
  expect(T::kCloseStatement, "'%}'");
  return s;
}

StmtPtr Parser::parse_set() {
  auto s = std::make_unique<Stmt>();
  auto target = make(Expr::Kind::kTuple);
  do {
    if (peek().type != T::kName) error("expected a variable name after set");
    auto n = make(Expr::Kind::kName);
    n->name = next().text;
    if (accept_op(".")) {
      if (peek().type != T::kName) error("expected an attribute name");
      auto attr = make(Expr::Kind::kAttr);
      attr->a = std::move(n);
      attr->name = next().text;
      n = std::move(attr);
    }
    target->items.push_back(std::move(n));
  } while (accept_op(","));
  s->target = target->items.size() == 1 ? std::move(target->items[0]) : std::move(target);
  if (accept_op("=")) {
    s->kind = Stmt::Kind::kSet;
    s->expr = parse_tuple(true);
    expect(T::kCloseStatement, "'%}'");
    return s;
  }
  s->kind = Stmt::Kind::kSetBlock;
  expect(T::kCloseStatement, "'%}'");
  std::string found;
  s->body = parse_until({"endset"}, found);
  expect(T::kCloseStatement, "'%}'");
  return s;
}

StmtPtr Parser::parse_macro() {
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::Kind::kMacro;
  if (peek().type != T::kName) error("expected a macro name");
  s->name = next().text;
  expect_op("(");
  while (!accept_op(")")) {
    if (peek().type != T::kName) error("expected a macro parameter name");
    std::string param = next().text;
    ExprPtr def = accept_op("=") ? parse_expression() : nullptr;
    s->params.emplace_back(param, std::move(def));
    if (!at_op(")")) expect_op(",");
  }
  expect(T::kCloseStatement, "'%}'");
  std::string found;
  s->body = parse_until({"endmacro"}, found);
  expect(T::kCloseStatement, "'%}'");
  return s;
}

ExprPtr Parser::parse_expression(bool ternary) {
  ExprPtr e = parse_or();
  if (ternary && at_name("if")) {
    next();
    auto t = make(Expr::Kind::kTernary);
    t->a = std::move(e);
    t->b = parse_or();
    if (accept_name("else")) t->c = parse_expression();
    return t;
  }
  return e;
}

ExprPtr Parser::parse_tuple(bool ternary) {
  ExprPtr first = parse_expression(ternary);
  if (!at_op(",")) return first;
  auto t = make(Expr::Kind::kTuple);
  t->items.push_back(std::move(first));
  while (accept_op(",")) {
    if (peek().type == T::kCloseStatement || peek().type == T::kCloseExpression) break;
    t->items.push_back(parse_expression(ternary));
  }
  return t;
}

ExprPtr Parser::parse_or() {
  ExprPtr e = parse_and();
  while (accept_name("or")) e = binary(Expr::Kind::kOr, "or", std::move(e), parse_and());
  return e;
}

ExprPtr Parser::parse_and() {
  ExprPtr e = parse_not();
  while (accept_name("and")) e = binary(Expr::Kind::kAnd, "and", std::move(e), parse_not());
  return e;
}

ExprPtr Parser::parse_not() {
  if (accept_name("not")) {
    auto e = make(Expr::Kind::kNot);
    e->a = parse_not();
    return e;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  ExprPtr e = parse_concat();
  while (true) {
    std::string op;
    if (peek().type == T::kOperator &&
        (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
         peek().text == "<=" || peek().text == ">=")) {
      op = next().text;
    } else if (accept_name("in")) {
      op = "in";
    } else if (at_name("not") && peek(1).type == T::kName && peek(1).text == "in") {
      next(), next();
      op = "not in";
    } else {
      return e;
    }
    e = binary(Expr::Kind::kBinary, op, std::move(e), parse_concat());
  }
}

ExprPtr Parser::parse_concat() {
  ExprPtr e = parse_math1();
  while (accept_op("~")) e = binary(Expr::Kind::kBinary, "~", std::move(e), parse_math1());
  return e;
}

ExprPtr Parser::parse_math1() {
  ExprPtr e = parse_math2();
  while (at_op("+") || at_op("-")) {
    std::string op = next().text;
    e = binary(Expr::Kind::kBinary, op, std::move(e), parse_math2());
  }
  return e;
}

ExprPtr Parser::parse_math2() {
  ExprPtr e = parse_pow();
  while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
    std::string op = next().text;
    e = binary(Expr::Kind::kBinary, op, std::move(e), parse_pow());
  }
  return e;
}

ExprPtr Parser::parse_pow() {
  ExprPtr e = parse_unary();
  while (accept_op("**")) e = binary(Expr::Kind::kBinary, "**", std::move(e), parse_unary());
  return e;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  ExprPtr e;
  if (at_op("-") || at_op("+")) {
    e = make(Expr::Kind::kUnary);
    e->name = next().text;
    e->a = parse_unary(false);
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  return with_filter ? parse_filters(std::move(e)) : std::move(e);
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  while (true) {
    if (accept_op(".")) {
      auto a = make(Expr::Kind::kAttr);
      if (peek().type != T::kName && peek().type != T::kInt) error("expected an attribute name after '.'");
      bool index = peek().type == T::kInt;
      a->name = next().text;
      if (index) {  // x.0 is x[0]
        a->kind = Expr::Kind::kIndex;
        a->b = make(Expr::Kind::kLiteral);
        a->b->literal = Value(int64_t(std::stoll(a->name)));
      }
      a->a = std::move(e);
      e = std::move(a);
    } else if (accept_op("[")) {
      ExprPtr parts[3];
      int n = 0;
      bool slice = false;
      while (!at_op("]")) {
        if (accept_op(":")) {
          slice = true;
          if (++n > 2) error("a slice takes at most three parts");
          continue;
        }
        if (parts[n]) error("expected ':' or ']' in a subscript");
        parts[n] = parse_expression();
      }
      expect_op("]");
      auto s = make(slice ? Expr::Kind::kSlice : Expr::Kind::kIndex);
      if (!slice && !parts[0]) error("empty subscript []");
      s->a = std::move(e), s->b = std::move(parts[0]), s->c = std::move(parts[1]), s->step = std::move(parts[2]);
      e = std::move(s);
    } else if (at_op("(")) {
      auto c = make(Expr::Kind::kCall);
      c->a = std::move(e);
      parse_args(*c);
      e = std::move(c);
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_filters(ExprPtr e) {
  while (true) {
    if (accept_op("|")) {
      auto f = make(Expr::Kind::kFilter);
      if (peek().type != T::kName) error("expected a filter name after '|'");
      f->name = next().text;
      while (accept_op(".")) f->name += "." + next().text;
      if (at_op("(")) parse_args(*f);
      f->a = std::move(e);
      e = std::move(f);
    } else if (accept_name("is")) {
      auto t = make(Expr::Kind::kTest);
      t->negated = accept_name("not");
      if (peek().type != T::kName) error("expected a test name after 'is'");
      t->name = next().text;
      if (at_op("(")) {
        parse_args(*t);
      } else if (peek().type == T::kString || peek().type == T::kInt || peek().type == T::kFloat) {
        t->items.push_back(parse_primary());
      }
      t->a = std::move(e);
      e = std::move(t);
    } else {
      return e;
    }
  }
}

void Parser::parse_args(Expr& call) {
  expect_op("(");
  while (!accept_op(")")) {
    if (peek().type == T::kName && peek(1).type == T::kOperator && peek(1).text == "=") {
      std::string key = next().text;
      next();
      call.kwargs.emplace_back(key, parse_expression());
    } else {
      if (!call.kwargs.empty()) error("a positional argument follows keyword arguments");
      call.items.push_back(parse_expression());
    }
    if (!at_op(")")) expect_op(",");
  }
}

ExprPtr Parser::parse_primary() {
  const Token& t = peek();
  auto lit = [&](Value v) {
    auto e = make(Expr::Kind::kLiteral);
    e->literal = std::move(v);
    next();
    return e;
  };
  switch (t.type) {
    case T::kString: {
      std::string s = next().text;
      while (peek().type == T::kString) s += next().text;  // "a" "b" is "ab"
      auto e = make(Expr::Kind::kLiteral);
      e->literal = Value(std::move(s));
      return e;
    }
    case T::kInt: return lit(Value(int64_t(std::stoll(t.text))));
    case T::kFloat: return lit(Value(std::stod(t.text)));
    case T::kName: {
      if (t.text == "true" || t.text == "True") return lit(Value(true));
      if (t.text == "false" || t.text == "False") return lit(Value(false));
      if (t.text == "none" || t.text == "None") return lit(Value::none());
      auto e = make(Expr::Kind::kName);
      e->name = next().text;
      return e;
    }
    case T::kOperator:
      if (accept_op("(")) {
        if (accept_op(")")) return make(Expr::Kind::kTuple);
        ExprPtr e = parse_tuple(true);
        expect_op(")");
        return e;
      }
      if (accept_op("[")) {
        auto e = make(Expr::Kind::kList);
        while (!accept_op("]")) {
          e->items.push_back(parse_expression());
          if (!at_op("]")) expect_op(",");
        }
        return e;
      }
      if (accept_op("{")) {
        auto e = make(Expr::Kind::kDict);
        while (!accept_op("}")) {
          ExprPtr k = parse_expression();
          expect_op(":");
          e->entries.emplace_back(std::move(k), parse_expression());
          if (!at_op("}")) expect_op(",");
        }
        return e;
      }
      [[fallthrough]];
    default: error("unexpected " + describe(t) + " in an expression");
  }
}

}  // namespace

Body parse(const std::vector<Token>& tokens, const std::string& name) {
  try {
    return Parser(tokens).parse_all();
  } catch (const Error& e) {
    fail("chat template ", name, ": syntax error: ", e.what());
  }
}

}  // namespace ms::jinja

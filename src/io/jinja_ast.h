// Tokens and syntax tree of the Jinja subset (internal to the jinja_* files).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "io/jinja_value.h"

namespace ms::jinja {

struct Token {
  enum class Type { kText, kOpenStatement, kCloseStatement, kOpenExpression, kCloseExpression, kName, kString,
                    kInt, kFloat, kOperator, kEnd };
  Type type;
  std::string text;
  int line;
};

// Cuts a template into text and tag tokens, applying whitespace control ({%- -%} {{- -}}),
// trim_blocks and lstrip_blocks (both on, as transformers renders chat templates) and
// dropping comments and the final newline.
std::vector<Token> tokenize(const std::string& source);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind { kLiteral, kName, kList, kTuple, kDict, kAttr, kIndex, kSlice, kCall, kFilter, kTest, kUnary,
                    kBinary, kAnd, kOr, kNot, kTernary };
  Kind kind;
  int line = 0;
  Value literal;           // kLiteral
  std::string name;        // kName, kAttr (attribute), kFilter/kTest (name), kUnary/kBinary (operator)
  ExprPtr a, b, c;         // operands; kSlice: object, start, stop; kTernary: then, cond, else
  ExprPtr step;            // kSlice
  std::vector<ExprPtr> items;                              // kList, kTuple, kCall/kFilter/kTest positional args
  std::vector<std::pair<std::string, ExprPtr>> kwargs;     // kCall/kFilter/kTest keyword args
  std::vector<std::pair<ExprPtr, ExprPtr>> entries;        // kDict
  bool negated = false;                                    // kTest: `is not`
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue };
  Kind kind;
  int line = 0;
  std::string text;                   // kText
  ExprPtr expr;                       // kOutput, kSet value, kFor iterable, kIf condition
  ExprPtr target;                     // kSet/kSetBlock/kFor: name, tuple or attribute
  ExprPtr filter;                     // kFor: `if` condition
  Body body, else_body;               // kIf, kFor, kSetBlock, kMacro
  std::string name;                   // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: name, default (may be null)
};

// Parses the tokens of a template; errors name the template and line.
Body parse(const std::vector<Token>& tokens, const std::string& name);

}  // namespace ms::jinja

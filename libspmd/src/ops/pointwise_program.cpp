#include "spmd/ops/pointwise_program.h"

#include "spmd/ops/dtype.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace spmd {

const std::vector<PointwiseOpInfo>& pointwiseOps() {
  using P = PointwiseOp;
  static const std::vector<PointwiseOpInfo> ops = {
      {P::Add, "add", 2},          {P::Sub, "sub", 2},
      {P::Mul, "mul", 2},          {P::Div, "div", 2},
      {P::Neg, "neg", 1},          {P::Relu, "relu", 1},
      {P::ThresholdGrad, "threshold_grad", 3},
      {P::Gelu, "gelu", 1},        {P::GeluGrad, "gelu_grad", 2},
      {P::GeluTanh, "gelu_tanh", 1}, {P::GeluTanhGrad, "gelu_tanh_grad", 2},
      {P::Tanh, "tanh", 1},        {P::TanhGrad, "tanh_grad", 2},
      {P::Sigmoid, "sigmoid", 1},  {P::SigmoidGrad, "sigmoid_grad", 2},
      {P::Silu, "silu", 1},        {P::SiluGrad, "silu_grad", 2},
      {P::Exp, "exp", 1},          {P::Log, "log", 1},
      {P::Sqrt, "sqrt", 1},        {P::Rsqrt, "rsqrt", 1},
      {P::Pow, "pow", 2},          {P::Cast, "cast", 1},
      {P::Lerp, "lerp", 3},         {P::Pair, "pair", 2},
      {P::RowSum, "row_sum", 1},   {P::RowMax, "row_max", 1},
      {P::Bernoulli, "bernoulli", 3},
  };
  return ops;
}

const PointwiseOpInfo& pointwiseOpInfo(PointwiseOp op) {
  for (const auto& info : pointwiseOps()) {
    if (info.op == op) return info;
  }
  throw std::logic_error("pointwise op without an entry in pointwiseOps()");
}

std::vector<int> seedInputs(const PointwiseProgram& program) {
  std::vector<int> seeds;
  for (const PointwiseStatement& s : program.statements) {
    if (s.op != PointwiseOp::Bernoulli) continue;
    const int k = s.operands[0].index;
    if (std::find(seeds.begin(), seeds.end(), k) == seeds.end()) seeds.push_back(k);
  }
  std::sort(seeds.begin(), seeds.end());
  return seeds;
}

float roundedTo(c10::ScalarType t, double value) {
  const auto f = static_cast<float>(value);
  if (t == c10::ScalarType::BFloat16) return static_cast<float>(c10::BFloat16(f));
  if (t == c10::ScalarType::Half) return static_cast<float>(c10::Half(f));
  return f;
}

double dropoutScale(c10::ScalarType mask, double divisor) { return roundedTo(mask, 1.0f / static_cast<float>(divisor)); }

// (word >> 8) < p 2^24, with word >> 8 an integer: (word >> 8) < ceil(p 2^24).
uint64_t keepBound(float p) {
  const double bound = std::ceil(static_cast<double>(p) * 16777216.0);
  if (!(bound > 0)) return 0;  // p <= 0 (or NaN): nothing kept
  return bound >= 16777216.0 ? uint64_t{1} << 32 : static_cast<uint64_t>(bound) << 8;
}

bool isRowReduction(PointwiseOp op) { return op == PointwiseOp::RowSum || op == PointwiseOp::RowMax; }

bool hasRowReductions(const PointwiseProgram& program) {
  for (const PointwiseStatement& s : program.statements) {
    if (isRowReduction(s.op)) return true;
  }
  return false;
}

bool hasPairs(const PointwiseProgram& program) {
  for (const PointwiseStatement& s : program.statements) {
    if (s.op == PointwiseOp::Pair) return true;
  }
  return false;
}

void checkPairs(const PointwiseProgram& program, const std::vector<int64_t>& shape) {
  if (!hasPairs(program)) return;
  if (hasRowReductions(program)) throw std::invalid_argument("a row program takes no pair");
  if (shape.empty() || shape.back() != 2) throw std::invalid_argument("a pair needs a last dimension of size 2");
}

bool constantAlongRows(const std::vector<int64_t>& input, const std::vector<int64_t>& shape) {
  return input.empty() || input.back() == 1 || shape.empty() || shape.back() == 1;
}

std::vector<bool> rowLevelStatements(const PointwiseProgram& program,
                                     const std::vector<std::vector<int64_t>>& inputShapes,
                                     const std::vector<int64_t>& shape) {
  std::vector<bool> row(program.statements.size(), false);
  if (!hasRowReductions(program)) return row;
  for (size_t i = 0; i < program.statements.size(); ++i) {
    const PointwiseStatement& s = program.statements[i];
    bool fromRows = true;
    for (const PointwiseOperand& o : s.operands) {
      if (o.kind == PointwiseOperand::Kind::Temp) fromRows = fromRows && row[o.index];
      if (o.kind == PointwiseOperand::Kind::Input) fromRows = fromRows && constantAlongRows(inputShapes.at(o.index), shape);
    }
    row[i] = isRowReduction(s.op) || fromRows;
  }
  for (size_t r = 0; r < program.results.size(); ++r) {
    if (isPerRowResult(program, r) && !row[program.results[r]]) {
      throw std::invalid_argument("row(t" + std::to_string(program.results[r]) + ") of a statement not at row level");
    }
  }
  return row;
}

bool isPerRowResult(const PointwiseProgram& program, size_t r) { return r < program.perRow.size() && program.perRow[r]; }

std::vector<int64_t> resultShape(const PointwiseProgram& program, size_t r, const std::vector<int64_t>& shape) {
  std::vector<int64_t> out = shape;
  if (!out.empty() && isPerRowResult(program, r)) out.back() = 1;
  return out;
}

bool isPointwiseDtype(c10::ScalarType t) {
  return t == c10::ScalarType::Float || t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Half;
}

std::string constantText(double value) {
  const float f = static_cast<float>(value);
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  std::string text = buf;
  // "2" reads as an operand name's digits would: keep constants visibly numbers.
  if (text.find_first_of(".einn") == std::string::npos) text += ".0";
  return text;
}

namespace {

class ProgramParser {
 public:
  explicit ProgramParser(std::string_view text) : text_(text) {}

  PointwiseProgram parse() {
    skipSpace();
    while (!atWord("return")) {
      program_.statements.push_back(statement());
      expect(';');
    }
    pos_ += 6;
    do {
      skipSpace();
      const size_t at = pos_;
      const bool perRow = atWord("row");
      if (perRow) {
        pos_ += 3;
        expect('(');
      }
      PointwiseOperand r = operand();
      if (r.kind != PointwiseOperand::Kind::Temp) fail(at, "a result must be a statement's value (tK)");
      if (perRow) expect(')');
      program_.results.push_back(r.index);
      program_.perRow.push_back(perRow);
      skipSpace();
    } while (accept(','));
    if (pos_ != text_.size()) fail(pos_, "unexpected text after the results");
    return std::move(program_);
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw std::invalid_argument("at character " + std::to_string(at) + ": " + what);
  }

  void skipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }

  bool atWord(std::string_view word) {
    skipSpace();
    return text_.substr(pos_, word.size()) == word &&
           (pos_ + word.size() == text_.size() || !std::isalnum(static_cast<unsigned char>(text_[pos_ + word.size()])));
  }

  bool accept(char c) {
    skipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!accept(c)) fail(pos_, std::string("expected '") + c + "'");
  }

  std::string word() {
    skipSpace();
    const size_t start = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
    if (start == pos_) fail(pos_, "expected a name");
    return std::string(text_.substr(start, pos_ - start));
  }

  int number(std::string_view digits, size_t at) const {
    if (digits.empty() || digits.size() > 6) fail(at, "expected a number after the operand's letter");
    int n = 0;
    for (char c : digits) {
      if (!std::isdigit(static_cast<unsigned char>(c))) fail(at, "expected a number after the operand's letter");
      n = n * 10 + (c - '0');
    }
    return n;
  }

  PointwiseStatement statement() {
    const size_t at = pos_;
    const std::string name = word();
    const int index = static_cast<int>(program_.statements.size());
    if (name != "t" + std::to_string(index)) fail(at, "expected statement t" + std::to_string(index));
    expect(':');
    skipSpace();
    const size_t dtypeAt = pos_;
    auto dtype = parseDtype(word());
    if (!dtype || !isPointwiseDtype(*dtype)) fail(dtypeAt, "expected f32, bf16 or f16");
    expect('=');
    PointwiseStatement s;
    s.dtype = *dtype;
    skipSpace();
    const size_t opAt = pos_;
    const PointwiseOpInfo* info = findOp(word());
    if (!info) fail(opAt, "unknown operation");
    s.op = info->op;
    expect('(');
    do {
      s.operands.push_back(operand());
    } while (accept(','));
    expect(')');
    if (static_cast<int>(s.operands.size()) != info->arity) {
      fail(opAt, std::string(info->name) + " takes " + std::to_string(info->arity) + " operand(s)");
    }
    if (s.op == PointwiseOp::Bernoulli && (s.operands[0].kind != PointwiseOperand::Kind::Input ||
                                           s.operands[1].kind != PointwiseOperand::Kind::Constant ||
                                           s.operands[2].kind != PointwiseOperand::Kind::Constant)) {
      fail(opAt, "bernoulli takes a seed input (inK), a probability and a value (numbers)");
    }
    return s;
  }

  static const PointwiseOpInfo* findOp(const std::string& name) {
    for (const auto& info : pointwiseOps()) {
      if (name == info.name) return &info;
    }
    return nullptr;
  }

  PointwiseOperand operand() {
    skipSpace();
    const size_t at = pos_;
    PointwiseOperand o;
    if (pos_ < text_.size() && (std::isdigit(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '-' ||
                                text_[pos_] == '.' || atWord("inf") || atWord("nan"))) {
      o.constant = constant();
      return o;
    }
    const std::string name = word();
    if (name.rfind("in", 0) == 0) {
      o.kind = PointwiseOperand::Kind::Input;
      o.index = number(std::string_view(name).substr(2), at);
      program_.numInputs = std::max(program_.numInputs, o.index + 1);
    } else if (name[0] == 't') {
      o.kind = PointwiseOperand::Kind::Temp;
      o.index = number(std::string_view(name).substr(1), at);
      if (o.index >= static_cast<int>(program_.statements.size())) fail(at, name + " is not defined before this point");
    } else {
      fail(at, "expected an operand: inK, tK or a number");
    }
    return o;
  }

  double constant() {
    const size_t at = pos_;
    const std::string rest(text_.substr(pos_, 40));
    char* end = nullptr;
    const double v = std::strtod(rest.c_str(), &end);
    if (end == rest.c_str()) fail(at, "expected a number");
    pos_ += static_cast<size_t>(end - rest.c_str());
    return v;
  }

  std::string_view text_;
  size_t pos_ = 0;
  PointwiseProgram program_;
};

std::string operandText(const PointwiseOperand& o) {
  switch (o.kind) {
    case PointwiseOperand::Kind::Input: return "in" + std::to_string(o.index);
    case PointwiseOperand::Kind::Temp: return "t" + std::to_string(o.index);
    case PointwiseOperand::Kind::Constant: return constantText(o.constant);
  }
  return "";
}

}  // namespace

PointwiseProgram parsePointwiseProgram(std::string_view text) {
  PointwiseProgram p = ProgramParser(text).parse();
  if (p.results.empty()) throw std::invalid_argument("the program returns nothing");
  return p;
}

std::string printPointwiseProgram(const PointwiseProgram& program) {
  std::string out;
  for (size_t i = 0; i < program.statements.size(); ++i) {
    const PointwiseStatement& s = program.statements[i];
    out += "t" + std::to_string(i) + ":" + dtypeShortName(s.dtype) + " = " + pointwiseOpInfo(s.op).name + "(";
    for (size_t k = 0; k < s.operands.size(); ++k) out += (k ? ", " : "") + operandText(s.operands[k]);
    out += "); ";
  }
  out += "return ";
  for (size_t k = 0; k < program.results.size(); ++k) {
    const std::string t = "t" + std::to_string(program.results[k]);
    out += (k ? ", " : "") + (isPerRowResult(program, k) ? "row(" + t + ")" : t);
  }
  return out;
}

}  // namespace spmd

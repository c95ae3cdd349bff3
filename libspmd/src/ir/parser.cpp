// The listing parser: the inverse of printListing (printer.cpp), line by
// line. Each line is one statement; a cursor over it tracks the column so
// that every error names LINE:COL and what was expected there.
#include "spmd/ir/parser.h"

#include "listing_lexer.h"

#include "spmd/ir/boxing.h"
#include "spmd/ops/dtype.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <set>
#include <vector>

namespace spmd {
namespace {

using listing::Cursor;
using listing::Number;
using listing::isDigit;
using listing::isIdentChar;
using listing::isNameChar;
using listing::isSpace;
using listing::inQuotes;

class Parser {
 public:
  Graph parse(const std::string& text) {
    size_t start = 0;
    bool sawHeader = false;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(start, end - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      ++lineNo_;
      start = end + 1;
      if (listing::isCommentLine(line)) continue;
      Cursor c(line, lineNo_);
      c.skipSpaces();
      if (!sawHeader) {
        parseHeader(c);
        sawHeader = true;
        continue;
      }
      parseStatement(c);
    }
    // At the end of input: the last line.
    const std::string last = std::to_string(std::max(lineNo_, 1)) + ":1";
    if (!sawHeader) throw Diagnostic(last, "expected 'graph', got end of input");
    if (!sawReturn_) throw Diagnostic(last, "expected 'return (...)' before the end of input");
    return std::move(graph_);
  }

  const std::vector<int>& nodeLines() const { return nodeLines_; }

 private:
  enum class Section { Inputs, Nodes, Updates, Gradients, Buckets };

  void parseHeader(Cursor& c) {
    if (!c.consumeWord("graph")) c.expected("'graph'");
    c.skipSpaces();
    if (c.consume("{weights: ")) {
      // The file runs to the '}' that ends the group; ", format: F" names a
      // format other than torchscript.
      size_t start = c.pos();
      const std::string& s = c.text();
      size_t close = std::min({s.find("} {unrolled: ", start), s.find("} {training: ", start), s.find("} {flags: ", start)});
      if (close == std::string::npos) {
        close = s.find_last_not_of(" \t");
        if (close == std::string::npos || close < start || s[close] != '}') c.fail("expected '}' closing {weights: ...}");
      }
      std::string body = s.substr(start, close - start);
      WeightsRef w{body, "torchscript"};
      size_t fmt = body.rfind(", format: ");
      if (fmt != std::string::npos) {
        w.file = body.substr(0, fmt);
        w.format = body.substr(fmt + 10);
        if (w.format != "torchscript" && w.format != "torch.save" && w.format != "pt2") {
          c.failAt(start + fmt + 10, "unknown weights format " + inQuotes(w.format) + " (torchscript, pt2, torch.save)");
        }
      }
      if (w.file.empty()) c.failAt(start, "expected a weights file name");
      graph_.setWeights(w);
      c.setPos(close + 1);
      c.skipSpaces();
    }
    if (c.consume("{unrolled: ")) {
      size_t at = c.pos();
      Number n = c.number();
      if (n.isFloat || n.i < 1 || n.i > std::numeric_limits<int>::max()) c.failAt(at, "expected a positive iteration count");
      graph_.setIters(static_cast<int>(n.i));
      c.expect(" iterations}");
      c.skipSpaces();
    }
    if (c.consume("{training: ")) {
      const size_t start = c.pos();
      const size_t close = c.text().find('}', start);
      if (close == std::string::npos) c.fail("expected '}' closing {training: ...}");
      const std::string problem = parseTrainingText(c.text().substr(start, close - start), graph_.training());
      if (!problem.empty()) c.failAt(start, "bad {training: ...}: " + problem);
      c.setPos(close + 1);
      c.skipSpaces();
    }
    if (c.consume("{flags: ")) {  // the recorded flags, as printFlags writes them
      graph_.setFlags(c.flagWords());
      if (!c.consume("}")) c.fail("expected '}' closing {flags: ...}");
      c.skipSpaces();
    }
    endOfLine(c);
  }

  void endOfLine(Cursor& c) {
    c.skipSpaces();
    if (!c.atEnd()) c.expected("end of line");
  }

  // Moves the statement order forward; statements come in printListing's order.
  void enter(Cursor& c, Section s, const char* what) {
    if (sawReturn_ ? s < Section::Updates : s > Section::Nodes) {
      c.fail(std::string(what) + (sawReturn_ ? " after 'return'" : " before 'return'"));
    }
    if (s < section_) c.fail(std::string(what) + " out of order (inputs, nodes, return, updates, gradients, buckets)");
    section_ = s;
  }

  void parseStatement(Cursor& c) {
    if (c.consumeWord("input")) {
      enter(c, Section::Inputs, "input");
      parseInput(c);
    } else if (c.consumeWord("return")) {
      if (sawReturn_) c.fail("a second 'return'");
      sawReturn_ = true;
      section_ = Section::Updates;
      parseReturn(c);
    } else if (c.consumeWord("update")) {
      enter(c, Section::Updates, "update");
      parseUpdate(c);
    } else if (c.consumeWord("gradient")) {
      enter(c, Section::Gradients, "gradient");
      parseGradient(c);
    } else if (c.consumeWord("bucket")) {
      enter(c, Section::Buckets, "bucket");
      parseBucket(c);
    } else if (c.peek() == '%' || c.peek() == '_' || c.peek() == '=') {
      enter(c, Section::Nodes, "node");
      parseNode(c);
    } else {
      c.expected("'input', a node ('%name: type = op(...)'), 'return', 'update', 'gradient' or 'bucket'");
    }
  }

  void spaces(Cursor& c) {
    if (!isSpace(c.peek())) c.expected("a space");
    c.skipSpaces();
  }

  // %name or %"quoted name"; returns the name and leaves the cursor after it.
  std::string name(Cursor& c) {
    if (!c.consume("%")) c.expected("a value ('%name')");
    if (c.peek() == '"') {
      size_t at = c.pos();
      std::string n = c.str();
      if (n.empty()) c.failAt(at, "empty value name");
      return n;
    }
    size_t start = c.pos();
    while (!c.atEnd() && isNameChar(c.peek())) c.setPos(c.pos() + 1);
    if (c.pos() == start) c.expected("a value name after '%'");
    return c.text().substr(start, c.pos() - start);
  }

  ValueId use(Cursor& c) {
    size_t at = c.pos();
    std::string n = name(c);
    auto id = graph_.findValue(n);
    if (!id) c.failAt(at, "unknown value " + inQuotes("%" + n));
    return *id;
  }

  // A new value: %name: f32[2,3]
  Value define(Cursor& c) {
    size_t at = c.pos();
    Value v;
    v.name = name(c);
    if (graph_.findValue(v.name) || pending_.count(v.name)) c.failAt(at, "value " + inQuotes("%" + v.name) + " defined twice");
    c.expect(":");
    c.skipSpaces();
    size_t typeAt = c.pos();
    std::string dtype = c.ident();
    if (dtype.empty()) c.expected("a type such as f32[2,3]");
    auto parsed = parseDtype(dtype);
    if (!parsed) c.failAt(typeAt, "unknown dtype " + inQuotes(dtype));
    v.dtype = *parsed;
    if (!c.consume("[")) c.expected("'[' starting the shape");
    c.skipSpaces();
    if (!c.consume("]")) {
      while (true) {
        size_t dimAt = c.pos();
        if (!isDigit(c.peek())) c.expected("a dimension (an integer >= 0)");
        Number n = c.number();
        if (n.isFloat || n.i < 0) c.failAt(dimAt, "expected a dimension (an integer >= 0)");
        v.shape.push_back(n.i);
        c.skipSpaces();
        if (c.consume("]")) break;
        if (!c.consume(",")) c.expected("',' or ']' in the shape");
        c.skipSpaces();
      }
    }
    return v;
  }

  void parseInput(Cursor& c) {
    spaces(c);
    Value v = define(c);
    spaces(c);
    size_t at = c.pos();
    std::string kindName = c.ident();
    auto kind = parseInputKind(kindName);
    if (!kind) {
      c.setPos(at);
      c.expected("an input kind (data, parameter, buffer, state)");
    }
    bool requiresGrad = *kind == InputKind::Parameter;
    c.skipSpaces();
    size_t frozenAt = c.pos();
    if (c.consumeWord("frozen")) {
      if (*kind != InputKind::Parameter) c.failAt(frozenAt, "only parameters can be frozen");
      requiresGrad = false;
    }
    endOfLine(c);
    graph_.addInput(std::move(v), *kind, requiresGrad);
  }

  void parseNode(Cursor& c) {
    Node node;
    std::vector<Value> outs;
    std::vector<bool> present;
    if (!c.lookingAt("=")) {
      while (true) {
        if (c.peek() == '_' && !isNameChar(c.peek(1))) {
          c.setPos(c.pos() + 1);
          present.push_back(false);
        } else {
          Value v = define(c);
          pending_.insert(v.name);
          outs.push_back(std::move(v));
          present.push_back(true);
        }
        c.skipSpaces();
        if (!c.consume(",")) break;
        c.skipSpaces();
      }
    }
    pending_.clear();
    if (!c.consume("=")) c.expected("',' or '=' after the node's results");
    c.skipSpaces();
    size_t opAt = c.pos();
    std::string ns = c.ident();
    if (ns.empty() || !c.consume("::")) {
      c.setPos(opAt);
      c.expected("a qualified operator name such as aten::relu");
    }
    std::string opName = c.ident();
    if (opName.empty()) c.expected("an operator name after '::'");
    node.op = ns + "::" + opName;
    if (c.consume(".")) {
      node.overload = c.ident();
      if (node.overload.empty()) c.expected("an overload name after '.'");
    }
    auto handle = findOperator(node);
    if (!handle) c.failAt(opAt, "unknown operator " + inQuotes(node.qualifiedName()));
    if (!c.consume("(")) c.expected("'(' after the operator name");
    const auto& schemaArgs = handle->schema().arguments();
    c.skipSpaces();
    if (!c.consume(")")) {
      while (true) {
        size_t argAt = c.pos();
        size_t index = node.args.size();
        const c10::Argument* schemaArg = index < schemaArgs.size() ? &schemaArgs[index] : nullptr;
        node.args.push_back(arg(c, schemaArg, argAt));
        c.skipSpaces();
        if (c.consume(")")) break;
        if (!c.consume(",")) c.expected("',' or ')' after an argument");
        c.skipSpaces();
      }
    }
    c.skipSpaces();
    if (c.consume("#")) {
      node.meta = meta(c);
    } else {
      endOfLine(c);
    }
    size_t k = 0;
    for (bool p : present) node.outputs.push_back(p ? graph_.addValue(std::move(outs[k++])) : kNoValue);
    graph_.addNode(std::move(node));
    nodeLines_.push_back(lineNo_);
  }

  // "models.py:24 role=forward bucket=0 partition=1 iteration=previous":
  // the trailing key=value words are metadata, whatever precedes them the source.
  NodeMeta meta(Cursor& c) {
    NodeMeta m;
    c.skipSpaces();
    const std::string& s = c.text();
    size_t start = c.pos();
    size_t end = s.find_last_not_of(" \t");
    if (end == std::string::npos || end < start) c.expected("node metadata after '#'");
    ++end;
    // Split into words, remembering where each starts.
    std::vector<std::pair<size_t, std::string>> words;
    for (size_t i = start; i < end;) {
      while (i < end && isSpace(s[i])) ++i;
      size_t j = i;
      while (j < end && !isSpace(s[j])) ++j;
      if (j > i) words.emplace_back(i, s.substr(i, j - i));
      i = j;
    }
    auto isKey = [](const std::string& w) {
      for (const char* key : {"role=", "bucket=", "partition=", "iteration="}) {
        if (w.rfind(key, 0) == 0) return true;
      }
      return false;
    };
    size_t first = words.size();
    while (first > 0 && isKey(words[first - 1].second)) --first;
    if (first > 0) {
      size_t srcEnd = first < words.size() ? words[first].first : end;
      m.source = s.substr(start, srcEnd - start);
      while (!m.source.empty() && isSpace(m.source.back())) m.source.pop_back();
    }
    bool seen[4] = {false, false, false, false};
    for (size_t w = first; w < words.size(); ++w) {
      const auto& [at, word] = words[w];
      size_t eq = word.find('=');
      std::string key = word.substr(0, eq), val = word.substr(eq + 1);
      size_t valAt = at + eq + 1;
      int slot = key == "role" ? 0 : key == "bucket" ? 1 : key == "partition" ? 2 : 3;
      if (seen[slot]) c.failAt(at, "metadata " + inQuotes(key) + " given twice");
      seen[slot] = true;
      if (key == "role") {
        auto role = parseNodeRole(val);
        if (!role || *role == NodeRole::Unknown) {
          c.failAt(valAt, "unknown role " + inQuotes(val) + " (forward, backward, optimizer, comm)");
        }
        m.role = *role;
      } else if (key == "iteration") {
        auto tag = parseIterationTag(val);
        if (!tag || *tag == IterationTag::Every) c.failAt(valAt, "unknown iteration " + inQuotes(val) + " (previous, last)");
        m.iteration = *tag;
      } else {
        bool ok = !val.empty() && val.size() < 10;
        for (char ch : val) ok = ok && isDigit(ch);
        if (!ok) c.failAt(valAt, "expected an index >= 0 after " + inQuotes(key + "="));
        (key == "bucket" ? m.bucket : m.partition) = std::stoi(val);
      }
    }
    c.setPos(end);
    return m;
  }

  // The element kind a list argument of this schema type holds.
  static std::optional<Arg::Kind> listKindOf(const c10::Argument* schemaArg) {
    if (!schemaArg) return std::nullopt;
    c10::TypePtr t = schemaArg->type();
    if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
    auto list = t->cast<c10::ListType>();
    if (!list) return std::nullopt;
    c10::TypePtr elem = list->getElementType();
    if (auto opt = elem->cast<c10::OptionalType>()) elem = opt->getElementType();
    std::string name = elem->str();
    if (name == "int" || name == "SymInt") return Arg::Kind::Ints;
    if (name == "float") return Arg::Kind::Floats;
    if (name == "bool") return Arg::Kind::Bools;
    if (name == "Tensor") return Arg::Kind::Values;
    return std::nullopt;
  }

  Arg list(Cursor& c, const c10::Argument* schemaArg, size_t at) {
    c.expect("[");
    c.skipSpaces();
    Arg a;
    std::optional<Arg::Kind> kind;
    std::vector<Number> numbers;
    if (!c.consume("]")) {
      while (true) {
        size_t elemAt = c.pos();
        Arg::Kind k;
        if (c.peek() == '%') {
          k = Arg::Kind::Values;
          a.values.push_back(use(c));
        } else if (c.consumeWord("None")) {  // an absent element of a Tensor?[]
          k = Arg::Kind::Values;
          a.values.push_back(kNoValue);
        } else if (c.consumeWord("True") || c.consumeWord("False")) {
          k = Arg::Kind::Bools;
          a.bools.push_back(c.text()[elemAt] == 'T');
        } else if (isDigit(c.peek()) || c.peek() == '-' || c.peek() == '+' || c.lookingAt("inf") || c.lookingAt("nan")) {
          numbers.push_back(c.number());
          k = Arg::Kind::Ints;
        } else {
          c.expected("a list element (a value, an integer, a float or True/False)");
        }
        if (kind && *kind != k) c.failAt(elemAt, "list elements of different kinds");
        kind = k;
        c.skipSpaces();
        if (c.consume("]")) break;
        if (!c.consume(",")) c.expected("',' or ']' in the list");
        c.skipSpaces();
      }
    }
    if (!kind) {
      auto fromSchema = listKindOf(schemaArg);
      if (!fromSchema) c.failAt(at, "cannot tell the kind of the empty list from the operator's schema");
      a.kind = *fromSchema;
      return a;
    }
    a.kind = *kind;
    if (a.kind == Arg::Kind::Ints) {
      bool anyFloat = false;
      for (const Number& n : numbers) anyFloat = anyFloat || n.isFloat;
      // Integers where the schema wants floats are floats ([1, 2] for float[]).
      if (anyFloat || listKindOf(schemaArg) == Arg::Kind::Floats) {
        a.kind = Arg::Kind::Floats;
        for (const Number& n : numbers) a.floats.push_back(n.isFloat ? n.f : static_cast<double>(n.i));
      } else {
        for (const Number& n : numbers) a.ints.push_back(n.i);
      }
    }
    return a;
  }

  Arg arg(Cursor& c, const c10::Argument* schemaArg, size_t at) {
    Arg a;
    char ch = c.peek();
    if (ch == '%') return Arg::tensor(use(c));
    if (ch == '[') return list(c, schemaArg, at);
    if (ch == '"') {
      a.kind = Arg::Kind::Str;
      a.s = c.str();
      return a;
    }
    if (c.consumeWord("None")) return Arg::none();
    if (c.consumeWord("True")) return Arg::ofBool(true);
    if (c.consumeWord("False")) return Arg::ofBool(false);
    if (c.consume("device(")) {
      if (c.peek() != '"') c.expected("a device string such as \"cpu\"");
      a.kind = Arg::Kind::Device;
      a.s = c.str();
      c.expect(")");
      return a;
    }
    if (c.consume("torch.")) {
      size_t nameAt = c.pos();
      std::string n = c.ident();
      if (auto dt = parseDtype(n)) {
        a.kind = Arg::Kind::DType;
        a.i = static_cast<int64_t>(*dt);
      } else if (auto layout = parseLayout(n)) {
        a.kind = Arg::Kind::Layout;
        a.i = *layout;
      } else if (auto format = parseMemoryFormat(n)) {
        a.kind = Arg::Kind::MemoryFormat;
        a.i = *format;
      } else {
        c.failAt(nameAt, "unknown torch constant " + inQuotes("torch." + n) + " (a dtype, layout or memory format)");
      }
      return a;
    }
    if (isDigit(ch) || ch == '-' || ch == '+' || c.lookingAt("inf") || c.lookingAt("nan")) {
      Number n = c.number();
      return n.isFloat ? Arg::ofFloat(n.f) : Arg::ofInt(n.i);
    }
    c.expected("an argument (a value, None, a number, True/False, a string, device(...), torch.NAME or a list)");
  }

  void parseReturn(Cursor& c) {
    c.skipSpaces();
    if (!c.consume("(")) c.expected("'('");
    c.skipSpaces();
    if (!c.consume(")")) {
      while (true) {
        graph_.addOutput(use(c));
        c.skipSpaces();
        if (c.consume(")")) break;
        if (!c.consume(",")) c.expected("',' or ')'");
        c.skipSpaces();
      }
    }
    endOfLine(c);
  }

  void parseUpdate(Cursor& c) {
    spaces(c);
    StateUpdate u;
    u.input = use(c);
    c.skipSpaces();
    c.expect("<-");
    c.skipSpaces();
    u.value = use(c);
    endOfLine(c);
    graph_.addUpdate(u);
  }

  void parseGradient(Cursor& c) {
    spaces(c);
    Gradient g;
    g.parameter = use(c);
    c.skipSpaces();
    c.expect("=");
    c.skipSpaces();
    g.value = use(c);
    c.skipSpaces();
    if (c.consume(",")) {
      c.skipSpaces();
      if (!c.consumeWord("reduced")) c.expected("'reduced'");
      spaces(c);
      g.reduced = use(c);
    }
    endOfLine(c);
    graph_.addGradient(g);
  }

  // bucket 0: 220000 bytes (%fc1.weight, %fc1.bias)
  void parseBucket(Cursor& c) {
    spaces(c);
    size_t at = c.pos();
    if (!isDigit(c.peek())) c.expected("the bucket's index");
    Number index = c.number();
    if (index.isFloat || index.i != static_cast<int64_t>(buckets_.size())) {
      c.failAt(at, "expected bucket " + std::to_string(buckets_.size()) + " (buckets are numbered in order)");
    }
    c.expect(":");
    spaces(c);
    Bucket b;
    at = c.pos();
    if (!isDigit(c.peek())) c.expected("the bucket's size in bytes");
    Number size = c.number();
    if (size.isFloat) c.failAt(at, "expected the bucket's size in bytes (an integer)");
    b.bytes = size.i;
    spaces(c);
    c.expect("bytes");
    c.skipSpaces();
    c.expect("(");
    c.skipSpaces();
    if (!c.consume(")")) {
      while (true) {
        b.parameters.push_back(use(c));
        c.skipSpaces();
        if (c.consume(")")) break;
        if (!c.consume(",")) c.expected("',' or ')'");
        c.skipSpaces();
      }
    }
    endOfLine(c);
    buckets_.push_back(std::move(b));
    graph_.setBuckets(buckets_);
  }

  Graph graph_;
  std::vector<Bucket> buckets_;
  std::set<std::string> pending_;  // results of the node being read
  Section section_ = Section::Inputs;
  bool sawReturn_ = false;
  int lineNo_ = 0;               // of the statement being read
  std::vector<int> nodeLines_;  // the line of each node, in program order
};

}  // namespace

Graph parseListing(const std::string& text) { return Parser().parse(text); }

std::vector<int> listingNodeLines(const std::string& text) {
  Parser parser;
  parser.parse(text);
  return parser.nodeLines();
}

bool looksLikeListing(const std::string& text) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (listing::isCommentLine(line)) continue;
    size_t i = line.find_first_not_of(" \t");
    return line.compare(i, 5, "graph") == 0 && (i + 5 == line.size() || !isIdentChar(line[i + 5]));
  }
  return false;
}

}  // namespace spmd

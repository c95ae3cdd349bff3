#include "spmd/ops/cuda_codegen.h"

#include "pointwise_formulas.h"

#include "spmd/ops/dtype.h"

#include <algorithm>
#include <functional>
#include <regex>
#include <cmath>
#include <set>
#include <stdexcept>

namespace spmd {
namespace {

int64_t product(const std::vector<int64_t>& shape, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t d = from; d < to; ++d) p *= shape[d];
  return p;
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) s += (d ? "," : "") + std::to_string(shape[d]);
  return s + "]";
}

// The offset of element `i` of the iteration space `out` in a contiguous
// input of shape `in`: runs of dimensions the input has in full act as one
// dimension; the broadcast ones contribute nothing.
std::string indexExpr(std::vector<int64_t> in, const std::vector<int64_t>& out, const std::string& suffix,
                      const std::string& element = "i") {
  in.insert(in.begin(), out.size() - in.size(), 1);
  if (in == out) return element;
  if (product(in, 0, in.size()) == 1) return "0";
  std::vector<std::string> terms;
  size_t d = 0;
  while (d < out.size()) {
    if (in[d] != out[d] || out[d] == 1) {
      ++d;
      continue;
    }
    size_t e = d;
    while (e + 1 < out.size() && in[e + 1] == out[e + 1]) ++e;
    const int64_t run = product(out, d, e + 1), inner = product(out, e + 1, out.size());
    const int64_t stride = product(in, e + 1, in.size());
    std::string t = element;
    if (inner != 1) t = "(" + t + " / " + std::to_string(inner) + suffix + ")";
    if (d != 0) t = "(" + t + " % " + std::to_string(run) + suffix + ")";
    if (stride != 1) t += " * " + std::to_string(stride) + suffix;
    terms.push_back(t);
    d = e + 1;
  }
  std::string expr;
  for (size_t k = 0; k < terms.size(); ++k) expr += (k ? " + " : "") + terms[k];
  return expr;
}

// The offset of element `element` of the iteration space `out` in an input
// of shape `in` laid out with `strides` (in elements): each run of dimensions
// that the input has in full and whose strides nest as a contiguous run's
// acts as one dimension; broadcast dimensions (size 1, or stride 0)
// contribute nothing.
std::string stridedIndexExpr(std::vector<int64_t> in, std::vector<int64_t> strides, const std::vector<int64_t>& out,
                             const std::string& suffix, const std::string& element) {
  in.insert(in.begin(), out.size() - in.size(), 1);
  strides.insert(strides.begin(), out.size() - strides.size(), 0);
  auto varies = [&](size_t d) { return in[d] == out[d] && out[d] != 1 && strides[d] != 0; };
  std::vector<std::string> terms;
  size_t d = 0;
  while (d < out.size()) {
    if (!varies(d)) {
      ++d;
      continue;
    }
    size_t e = d;
    while (e + 1 < out.size() && varies(e + 1) && strides[e] == strides[e + 1] * out[e + 1]) ++e;
    const int64_t run = product(out, d, e + 1), inner = product(out, e + 1, out.size());
    std::string t = element;
    if (inner != 1) t = "(" + t + " / " + std::to_string(inner) + suffix + ")";
    if (product(out, 0, d) != 1) t = "(" + t + " % " + std::to_string(run) + suffix + ")";
    if (strides[e] != 1) t += " * " + std::to_string(strides[e]) + suffix;
    terms.push_back(t);
    d = e + 1;
  }
  if (terms.empty()) return "0";
  std::string expr;
  for (size_t k = 0; k < terms.size(); ++k) expr += (k ? " + " : "") + terms[k];
  return expr;
}

// `expr` in parentheses, unless it is one parenthesized group already.
std::string enclosed(const std::string& expr) {
  int depth = 0;
  for (size_t c = 0; c < expr.size(); ++c) {
    depth += expr[c] == '(' ? 1 : expr[c] == ')' ? -1 : 0;
    if (depth == 0 && c + 1 < expr.size()) return "(" + expr + ")";
  }
  return expr;
}

std::string rounded(c10::ScalarType t, const std::string& expr) {
  if (t == c10::ScalarType::Float) return expr;
  return toFloatExpr(t, fromFloatExpr(t, expr));
}

// The two kernels of one program: `spmd_fused`, one element per iteration,
// for any alignment; `spmd_fused_vec`, four or eight per iteration with
// vector loads and stores of the operands that span the iteration space.
struct KernelText {
  const PointwiseProgram& program;
  const std::vector<KernelTensor>& inputs;
  const std::vector<int64_t>& shape;
  std::string suffix;

  // Input k's offset for element `element` of the iteration space.
  std::string indexOf(size_t k, const std::string& element = "i") const {
    if (inputs[k].strides.empty()) return indexExpr(inputs[k].shape, shape, suffix, element);
    return stridedIndexExpr(inputs[k].shape, inputs[k].strides, shape, suffix, element);
  }
  bool strided(size_t k) const { return !inputs[k].strides.empty(); }
  bool full(size_t k) const { return !isSeed(k) && !strided(k) && indexOf(k) == "i"; }
  bool isSeed(size_t k) const { return inputs[k].dtype == c10::ScalarType::Long; }

  // A broadcast input whose last dimension is the iteration space's, a
  // whole number of vectors long (a bias): a vector's elements are
  // consecutive in it too, so it is read a vector at a time. Its vector
  // type must be one of width `w`'s.
  bool runs(size_t k, int w) const {
    const std::vector<int64_t>& in = inputs[k].shape;
    if (full(k) || strided(k) || in.empty() || in.back() != shape.back() || shape.back() % w != 0) return false;
    return w == 4 || inputs[k].dtype != c10::ScalarType::Float;
  }
  c10::ScalarType resultType(size_t r) const { return program.statements[program.results[r]].dtype; }
  bool isResult(int statement) const {
    return std::find(program.results.begin(), program.results.end(), statement) != program.results.end();
  }

  std::string signature(const std::string& name) const {
    std::string s = "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kFusedBlockSize) + ") " + name + "(";
    for (size_t k = 0; k < inputs.size(); ++k) {
      s += std::string(k ? ",\n    " : "\n    ") + "const " + storageTypeName(inputs[k].dtype) + "* __restrict__ in" +
           std::to_string(k) + "  /* " + dtypeShortName(inputs[k].dtype) + shapeText(inputs[k].shape) +
           (strided(k) ? " strides " + shapeText(inputs[k].strides) : "") + " */";
    }
    for (size_t r = 0; r < program.results.size(); ++r) {
      s += std::string(",\n    ") + storageTypeName(resultType(r)) + "* __restrict__ out" + std::to_string(r) + "  /* " +
           dtypeShortName(resultType(r)) + shapeText(resultShape(program, r, shape)) + " */";
    }
    return s + ") {\n";
  }

  // The statements for element i, each input read by `load(k)`, each seed
  // input's random word for the element given by `word(k)`, each result
  // written by `store(r, value)`.
  std::string body(const std::string& pad, const std::function<std::string(size_t)>& load,
                   const std::function<std::string(size_t)>& word,
                   const std::function<std::string(size_t, const std::string&)>& store) const {
    std::string b;
    for (size_t k = 0; k < inputs.size(); ++k) {
      const std::string n = std::to_string(k);
      b += pad + (isSeed(k) ? "const unsigned int w" + n + " = " + word(k) : "const float a" + n + " = " + load(k)) + ";\n";
    }
    std::set<int> stored;  // results whose 16-bit value hK the statement keeps
    for (size_t i = 0; i < program.statements.size(); ++i) {
      const PointwiseStatement& st = program.statements[i];
      const std::string n = std::to_string(i);
      if (isResult(static_cast<int>(i)) && st.dtype != c10::ScalarType::Float && st.op != PointwiseOp::Bernoulli) {
        // Rounded once: the result stores the bits its readers read.
        b += pad + "const unsigned short h" + n + " = " + fromFloatExpr(st.dtype, opExpr(st)) + ";\n";
        b += pad + "const float t" + n + " = " + toFloatExpr(st.dtype, "h" + n) + ";\n";
        stored.insert(static_cast<int>(i));
      } else {
        // A bernoulli's value is rounded already (bernoulliExpr).
        const std::string value = st.op == PointwiseOp::Bernoulli ? opExpr(st) : rounded(st.dtype, opExpr(st));
        b += pad + "const float t" + n + " = " + value + ";\n";
      }
    }
    for (size_t r = 0; r < program.results.size(); ++r) {
      const int k = program.results[r];
      const std::string value = stored.count(k) ? "h" + std::to_string(k) : fromFloatExpr(resultType(r), "t" + std::to_string(k));
      b += pad + store(r, value) + ";\n";
    }
    return b;
  }

  std::string loop(const std::string& index, const std::string& var, int64_t count) const {
    const std::string block = std::to_string(kFusedBlockSize) + suffix;
    return "  for (" + index + " " + var + " = blockIdx.x * " + block + " + threadIdx.x; " + var + " < " +
           std::to_string(count) + suffix + "; " + var + " += gridDim.x * " + block + ") {\n";
  }

  std::string elementAt(size_t k) const {
    return toFloatExpr(inputs[k].dtype, "in" + std::to_string(k) + "[" + indexOf(k) + "]");
  }

  std::string scalarKernel(const std::string& index, int64_t numel) const {
    std::string s = signature(kFusedKernelName) + loop(index, "i", numel);
    s += body(
        "    ", [&](size_t k) { return elementAt(k); },
        [&](size_t k) {
          return "spmd_philox(in" + std::to_string(k) + "[0], i / 4" + suffix + ").v[i % 4" + suffix + "]";
        },
        [&](size_t r, const std::string& v) { return "out" + std::to_string(r) + "[i] = " + v; });
    return s + "  }\n}\n";
  }

  static std::string vectorType(c10::ScalarType t, int width) {
    if (width == 8) return "spmd_u16x8";
    return t == c10::ScalarType::Float ? "spmd_f32x4" : "spmd_u16x4";
  }

  // Eight 16-bit elements (16 bytes) per access where every vector operand
  // is 16-bit, else four (16 bytes of f32, 8 of 16-bit).
  int vectorWidth() const {
    bool sixteenBit = true;
    for (size_t k = 0; k < inputs.size(); ++k) sixteenBit = sixteenBit && (!full(k) || inputs[k].dtype != c10::ScalarType::Float);
    for (size_t r = 0; r < program.results.size(); ++r) sixteenBit = sixteenBit && resultType(r) != c10::ScalarType::Float;
    return sixteenBit ? 8 : 4;
  }

  std::string vectorKernel(const std::string& index, int64_t numel) const {
    const int w = vectorWidth();
    const std::string width = std::to_string(w);
    std::string s = w == 8 ? "struct alignas(16) spmd_u16x8 { unsigned short v[8]; };\n"
                           : "struct alignas(16) spmd_f32x4 { float v[4]; };\n"
                             "struct alignas(8) spmd_u16x4 { unsigned short v[4]; };\n";
    s += signature(std::string(kFusedKernelName) + "_vec") + loop(index, "n", numel / w);
    const std::string first = "(n * " + width + suffix + ")";  // a vector's first element
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (!full(k) && !runs(k, w)) continue;
      const std::string t = vectorType(inputs[k].dtype, w);
      const std::string at = full(k) ? "n" : enclosed(indexOf(k, first)) + " / " + width + suffix;
      s += "    const " + t + " l" + std::to_string(k) + " = reinterpret_cast<const " + t + "*>(in" +
           std::to_string(k) + ")[" + at + "];\n";
    }
    // A seed's words for the vector's elements, four a Philox call.
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (!isSeed(k)) continue;
      const std::string r = "r" + std::to_string(k);
      s += "    spmd_u32x4 " + r + "[" + std::to_string(w / 4) + "];\n";
      for (int q = 0; q < w / 4; ++q) {
        s += "    " + r + "[" + std::to_string(q) + "] = spmd_philox(in" + std::to_string(k) + "[0], n * " +
             std::to_string(w / 4) + suffix + " + " + std::to_string(q) + suffix + ");\n";
      }
    }
    for (size_t r = 0; r < program.results.size(); ++r) s += "    " + vectorType(resultType(r), w) + " s" + std::to_string(r) + ";\n";
    s += "#pragma unroll\n    for (" + index + " j = 0; j < " + width + suffix + "; ++j) {\n";
    s += "      const " + index + " i = n * " + width + suffix + " + j;\n";
    s += body(
        "      ",
        [&](size_t k) {
          return full(k) || runs(k, w) ? toFloatExpr(inputs[k].dtype, "l" + std::to_string(k) + ".v[j]") : elementAt(k);
        },
        [&](size_t k) { return "r" + std::to_string(k) + "[j / 4" + suffix + "].v[j % 4" + suffix + "]"; },
        [&](size_t r, const std::string& v) { return "s" + std::to_string(r) + ".v[j] = " + v; });
    s += "    }\n";
    for (size_t r = 0; r < program.results.size(); ++r) {
      const std::string t = vectorType(resultType(r), w);
      s += "    reinterpret_cast<" + t + "*>(out" + std::to_string(r) + ")[n] = s" + std::to_string(r) + ";\n";
    }
    return s + "  }\n}\n";
  }
};


// The kernel of a row program: `spmd_fused_rows`, one warp a row of the
// iteration space's last dimension. Each reduction is one pass over the row
// (its lanes take every 32nd element, then a warp shuffle combines them);
// the element-level statements it needs are computed again in each pass
// rather than kept. Where a lane's share of the row-varying inputs fits in
// kRowCachedFloatsPerLane registers (rows of 1024 with three inputs), they
// are read once, before the first pass; longer rows read them again each
// pass (from L1/L2). A last pass writes the element-level results; lane 0
// writes the per-row ones.
constexpr int64_t kRowCachedFloatsPerLane = 96;

struct RowKernelText {
  KernelText base;
  std::string index;
  std::vector<bool> row;
  int64_t columns, rows;
  std::set<int> varying;  // the inputs that vary along the row
  bool cached;            // whether a lane keeps its share of them in registers

  RowKernelText(const PointwiseProgram& program, const std::vector<KernelTensor>& inputs,
                const std::vector<int64_t>& shape, const std::string& index, const std::string& suffix)
      : base{program, inputs, shape, suffix},
        index(index),
        row(rowLevelStatements(program, shapesOf(inputs), shape)),
        columns(shape.back()),
        rows(product(shape, 0, shape.size() - 1)),
        varying(rowVaryingInputs()),
        cached(static_cast<int64_t>(varying.size()) * perLane() <= kRowCachedFloatsPerLane) {}

  static std::vector<std::vector<int64_t>> shapesOf(const std::vector<KernelTensor>& inputs) {
    std::vector<std::vector<int64_t>> shapes;
    for (const KernelTensor& t : inputs) shapes.push_back(t.shape);
    return shapes;
  }

  const PointwiseProgram& program() const { return base.program; }
  bool constantAlongRow(int input) const { return constantAlongRows(base.inputs[input].shape, base.shape); }
  std::string number(int64_t n) const { return std::to_string(n) + base.suffix; }

  // The element-level statements that `operands` read, directly or through
  // others, in program order; `inputs` gets the inputs they read.
  std::vector<size_t> elementClosure(const std::vector<PointwiseOperand>& operands, std::set<int>& inputs) const {
    std::set<size_t> needed;
    std::vector<PointwiseOperand> work = operands;
    while (!work.empty()) {
      const PointwiseOperand o = work.back();
      work.pop_back();
      if (o.kind == PointwiseOperand::Kind::Input && !constantAlongRow(o.index)) inputs.insert(o.index);
      if (o.kind != PointwiseOperand::Kind::Temp || row[o.index] || !needed.insert(o.index).second) continue;
      for (const PointwiseOperand& x : program().statements[o.index].operands) work.push_back(x);
    }
    return {needed.begin(), needed.end()};
  }

  // The inputs that vary along the row, which a lane keeps in registers
  // (its every 32nd element) where the row is short enough: each is then
  // read from memory once however many passes the reductions make.
  std::set<int> rowVaryingInputs() const {
    std::set<int> read;
    for (const PointwiseStatement& st : program().statements) {
      for (const PointwiseOperand& o : st.operands) {
        if (o.kind == PointwiseOperand::Kind::Input && !constantAlongRow(o.index)) read.insert(o.index);
      }
    }
    return read;
  }
  int64_t perLane() const { return (columns + 31) / 32; }

  // The loop over a lane's elements: each iteration's `body` sees j and i.
  std::string laneLoop(const std::string& body) const {
    const std::string n = number(columns);
    if (!cached) {
      return "  for (" + index + " j = lane; j < " + n + "; j += 32" + base.suffix + ") {\n    const " + index +
             " i = row * " + n + " + j;\n" + body + "  }\n";
    }
    std::string s = "#pragma unroll\n  for (" + index + " u = 0; u < " + number(perLane()) + "; ++u) {\n";
    // j and i, the element's place, only where the body reads or writes
    // memory or the row ends inside the lane's last element.
    const bool ragged = columns % 32 != 0, indexed = std::regex_search(body, std::regex("\\bi\\b"));
    if (ragged || indexed) s += "    const " + index + " j = lane + 32" + base.suffix + " * u;\n";
    if (ragged) s += "    if (j >= " + n + ") break;\n";
    if (indexed) s += "    const " + index + " i = row * " + n + " + j;\n";
    return s + body + "  }\n";
  }

  std::string cacheInputs() const {
    if (!cached || varying.empty()) return "";
    std::string decl, body;
    for (int k : varying) {
      decl += "  float c" + std::to_string(k) + "[" + std::to_string(perLane()) + "];\n";
      body += "    c" + std::to_string(k) + "[u] = " + base.elementAt(k) + ";\n";
    }
    return decl + laneLoop(body);
  }

  // A pass over the row's elements computing what `operands` need, then `tail`.
  std::string elementLoop(const std::vector<PointwiseOperand>& operands, const std::string& tail) const {
    std::set<int> inputs;
    const std::vector<size_t> needed = elementClosure(operands, inputs);
    std::string s;
    for (int k : inputs) {
      s += "    const float a" + std::to_string(k) + " = " + (cached ? "c" + std::to_string(k) + "[u]" : base.elementAt(k)) +
           ";\n";
    }
    for (size_t k : needed) {
      const PointwiseStatement& st = program().statements[k];
      s += "    const float t" + std::to_string(k) + " = " + rounded(st.dtype, opExpr(st)) + ";\n";
    }
    return laneLoop(s + tail);
  }

  std::string reduction(size_t k) const {
    const PointwiseStatement& st = program().statements[k];
    const bool sum = st.op == PointwiseOp::RowSum;
    const std::string acc = "r" + std::to_string(k), value = operandExpr(st.operands[0]);
    std::string s = "  float " + acc + " = " + (sum ? "0.0f" : floatLiteral(-INFINITY)) + ";\n";
    s += elementLoop(st.operands, "    " + acc + " = " + (sum ? acc + " + " + value : "spmd_max_nan(" + acc + ", " + value + ")") + ";\n");
    s += "  " + acc + " = " + (sum ? "spmd_warp_sum(" : "spmd_warp_max(") + acc + ");\n";
    return s + "  const float t" + std::to_string(k) + " = " + rounded(st.dtype, acc) + ";\n";
  }

  std::string results() const {
    std::vector<PointwiseOperand> elementResults;
    std::string tail, rowStores;
    for (size_t r = 0; r < program().results.size(); ++r) {
      const int k = program().results[r];
      const std::string value = fromFloatExpr(base.resultType(r), "t" + std::to_string(k));
      if (isPerRowResult(program(), r)) {
        rowStores += "  if (lane == 0) out" + std::to_string(r) + "[row] = " + value + ";\n";
      } else {
        elementResults.push_back({PointwiseOperand::Kind::Temp, k, 0});
        tail += "    out" + std::to_string(r) + "[i] = " + value + ";\n";
      }
    }
    return (elementResults.empty() ? "" : elementLoop(elementResults, tail)) + rowStores;
  }

  // The inputs that are the same along the row, read once, at its first element.
  std::string rowInputs() const {
    std::set<int> read;
    for (const PointwiseStatement& st : program().statements) {
      for (const PointwiseOperand& o : st.operands) {
        if (o.kind == PointwiseOperand::Kind::Input && constantAlongRow(o.index)) read.insert(o.index);
      }
    }
    std::string s;
    bool indexed = false;  // a 0-dim input is read at 0, without the row's index
    for (int k : read) {
      indexed = indexed || base.indexOf(k) != "0";
      s += "  const float a" + std::to_string(k) + " = " + base.elementAt(k) + ";\n";
    }
    if (!indexed) return s;
    return "  const " + index + " i = row * " + number(columns) + ";  // the row's first element\n" + s;
  }

  std::string kernel() const {
    std::string s = base.signature(kFusedRowsKernelName);
    s += "  const " + index + " row = blockIdx.x * " + number(kFusedRowsPerBlock) + " + threadIdx.x / 32" + base.suffix + ";\n";
    s += "  const " + index + " lane = threadIdx.x % 32" + base.suffix + ";\n";
    s += "  if (row >= " + number(rows) + ") return;  // a whole warp\n";
    s += rowInputs() + cacheInputs();
    for (size_t k = 0; k < program().statements.size(); ++k) {
      const PointwiseStatement& st = program().statements[k];
      if (isRowReduction(st.op)) {
        s += reduction(k);
      } else if (row[k]) {
        s += "  const float t" + std::to_string(k) + " = " + rounded(st.dtype, opExpr(st)) + ";\n";
      }
    }
    return s + results() + "}\n";
  }
};

// Every input is of a dtype the program computes in, but a bernoulli's
// seed: a 0-dim int64 tensor that nothing else reads. Row programs draw no
// masks.
void checkSeedInputs(const PointwiseProgram& program, const std::vector<KernelTensor>& inputs) {
  const std::vector<int> seeds = seedInputs(program);
  if (!seeds.empty() && hasRowReductions(program)) throw std::invalid_argument("a row program with a bernoulli");
  for (size_t k = 0; k < inputs.size(); ++k) {
    const bool seed = std::find(seeds.begin(), seeds.end(), static_cast<int>(k)) != seeds.end();
    if (seed && (inputs[k].dtype != c10::ScalarType::Long || !inputs[k].shape.empty())) {
      throw std::invalid_argument("bernoulli's seed in" + std::to_string(k) + " is not a 0-dim i64 tensor");
    }
    if (!seed && !isPointwiseDtype(inputs[k].dtype)) throw std::invalid_argument("an input of dtype " + dtypeName(inputs[k].dtype));
  }
  for (const PointwiseStatement& st : program.statements) {
    for (size_t o = st.op == PointwiseOp::Bernoulli ? 1 : 0; o < st.operands.size(); ++o) {
      const PointwiseOperand& x = st.operands[o];
      if (x.kind == PointwiseOperand::Kind::Input && std::find(seeds.begin(), seeds.end(), x.index) != seeds.end()) {
        throw std::invalid_argument("the seed in" + std::to_string(x.index) + " read as a number");
      }
    }
  }
}

}  // namespace

std::vector<int64_t> broadcastShapes(const std::vector<KernelTensor>& inputs) {
  std::vector<int64_t> out;
  for (const auto& in : inputs) {
    if (in.shape.size() > out.size()) out.insert(out.begin(), in.shape.size() - out.size(), 1);
    const size_t offset = out.size() - in.shape.size();
    for (size_t d = 0; d < in.shape.size(); ++d) {
      int64_t& o = out[offset + d];
      if (in.shape[d] == o || in.shape[d] == 1) continue;
      if (o != 1) throw std::invalid_argument("shapes " + shapeText(out) + " and " + shapeText(in.shape) + " do not broadcast");
      o = in.shape[d];
    }
  }
  return out;
}

int64_t fusedGridSize(int64_t numel, int multiprocessors) {
  const int64_t needed = (numel + kFusedBlockSize - 1) / kFusedBlockSize;
  return std::max<int64_t>(1, std::min<int64_t>(needed, int64_t{multiprocessors} * 16));
}

int64_t fusedRowBlocks(int64_t rows) { return (rows + kFusedRowsPerBlock - 1) / kFusedRowsPerBlock; }

int fusedVectorWidth(const PointwiseProgram& program, const std::vector<KernelTensor>& inputs) {
  if (hasRowReductions(program)) return 0;
  const std::vector<int64_t> shape = broadcastShapes(inputs);
  const KernelText k{program, inputs, shape, "u"};
  return product(shape, 0, shape.size()) % k.vectorWidth() == 0 ? k.vectorWidth() : 0;
}

std::string pointwiseKernelSource(const PointwiseProgram& program, const std::vector<KernelTensor>& inputs) {
  if (static_cast<int>(inputs.size()) != program.numInputs) {
    throw std::invalid_argument("the program reads " + std::to_string(program.numInputs) + " inputs, given " +
                                std::to_string(inputs.size()));
  }
  const std::vector<int64_t> shape = broadcastShapes(inputs);
  checkPairs(program, shape);
  const int64_t numel = product(shape, 0, shape.size());
  // 32-bit indices where neither the grid-stride loop nor a strided input's
  // offsets can overflow them.
  bool wide = numel > (int64_t{1} << 30);
  for (const KernelTensor& in : inputs) {
    if (in.strides.empty()) continue;
    if (in.strides.size() != in.shape.size()) throw std::invalid_argument("an input's strides do not match its shape");
    int64_t last = 0;
    for (size_t d = 0; d < in.shape.size(); ++d) {
      if (in.strides[d] < 0) throw std::invalid_argument("an input has a negative stride");
      last += (in.shape[d] - 1) * in.strides[d];
    }
    wide = wide || last > (int64_t{1} << 30);
  }
  const std::string index = wide ? "long long" : "unsigned int", suffix = wide ? "ll" : "u";

  std::set<c10::ScalarType> dtypes;
  std::set<PointwiseOp> ops;
  std::set<std::string> geluTanh;  // the tanh GELU helpers the statements call
  checkSeedInputs(program, inputs);
  for (const auto& in : inputs) {
    if (in.dtype != c10::ScalarType::Long) dtypes.insert(in.dtype);
  }
  for (const auto& s : program.statements) {
    dtypes.insert(s.dtype);
    ops.insert(s.op);
    if (s.op == PointwiseOp::GeluTanh) geluTanh.insert(geluTanhName(s.dtype));
    if (s.op == PointwiseOp::GeluTanhGrad) geluTanh.insert(geluTanhName(s.dtype) + "_grad");
  }

  std::string src = generatedBanner();
  src += "// " + printPointwiseProgram(program) + "\n";
  src += "// iteration space " + shapeText(shape) + ", " + std::to_string(numel) + " elements\n";
  src += prelude(dtypes, geluTanh, ops);
  if (hasRowReductions(program)) {
    if (shape.empty()) throw std::invalid_argument("a row program over a 0-dim iteration space");
    return src + RowKernelText(program, inputs, shape, index, suffix).kernel();
  }
  KernelText k{program, inputs, shape, suffix};
  src += k.scalarKernel(index, numel);
  if (numel % k.vectorWidth() == 0) src += k.vectorKernel(index, numel);
  return src;
}

namespace {

std::string pointwiseKey(const PointwiseProgram& program, const std::vector<KernelTensor>& inputs) {
  std::string key = "pointwise " + printPointwiseProgram(program) + " in=";
  for (size_t k = 0; k < inputs.size(); ++k) {
    key += (k ? "," : "") + dtypeShortName(inputs[k].dtype) + shapeText(inputs[k].shape);
    if (!inputs[k].strides.empty()) key += ":" + shapeText(inputs[k].strides);
  }
  return key;
}

}  // namespace

PointwiseKernelSpec::PointwiseKernelSpec(const std::string& programText, std::vector<KernelTensor> inputs)
    : PointwiseKernelSpec(parsePointwiseProgram(programText), std::move(inputs)) {}

PointwiseKernelSpec::PointwiseKernelSpec(PointwiseProgram program, std::vector<KernelTensor> inputs)
    : KernelSpec(pointwiseKey(program, inputs)), program_(std::move(program)), inputs_(std::move(inputs)) {}

const char* PointwiseKernelSpec::scalarKernelName() const {
  return hasRowReductions(program_) ? kFusedRowsKernelName : kFusedKernelName;
}

KernelLaunch PointwiseKernelSpec::launch(int multiprocessors, bool aligned) const {
  const std::vector<int64_t> space = shape();
  const int64_t numel = product(space, 0, space.size());
  if (hasRowReductions(program_)) {
    return {kFusedRowsKernelName, fusedRowBlocks(numel / space.back()), kFusedBlockSize, 0, std::nullopt};
  }
  const int width = aligned ? fusedVectorWidth(program_, inputs_) : 0;
  return {width > 0 ? kFusedVectorKernelName : kFusedKernelName,
          fusedGridSize(width > 0 ? numel / width : numel, multiprocessors), kFusedBlockSize, 0, std::nullopt};
}

}  // namespace spmd

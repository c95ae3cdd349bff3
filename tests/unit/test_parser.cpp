// The listing parser: every golden listing round-trips byte for byte, a
// JSON dump survives listing and back, and bad listings name LINE:COL.
#include "test_support.h"

#include "spmd/io/graph_json.h"
#include "spmd/ir/parser.h"
#include "spmd/ir/printer.h"
#include "spmd/support/diagnostic.h"

#include <dirent.h>

#include <algorithm>

using namespace spmd;

namespace {

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// tests/golden/*/*.txt that are listings (not stats, memory plans, verify
// reports or op lists).
std::vector<std::string> goldenListings() {
  const std::string root = std::string(SPMD_SOURCE_DIR) + "/tests/golden";
  std::vector<std::string> files;
  DIR* top = ::opendir(root.c_str());
  REQUIRE(top);
  while (dirent* d = ::readdir(top)) {
    std::string sub = d->d_name;
    if (sub == "." || sub == "..") continue;
    DIR* dir = ::opendir((root + "/" + sub).c_str());
    if (!dir) continue;
    while (dirent* f = ::readdir(dir)) {
      std::string name = f->d_name;
      if (!endsWith(name, ".txt")) continue;
      if (endsWith(name, ".stats.txt") || endsWith(name, ".memory.txt") || endsWith(name, ".verify.txt")) continue;
      std::string path = root + "/" + sub + "/" + name;
      if (looksLikeListing(testing::readFile(path))) files.push_back(path);
    }
    ::closedir(dir);
  }
  ::closedir(top);
  std::sort(files.begin(), files.end());
  return files;
}

// The message of the Diagnostic parsing `text` throws, as "WHERE: WHAT".
std::string parseError(const std::string& text) {
  try {
    parseListing(text);
  } catch (const Diagnostic& d) {
    return d.where() + ": " + d.message();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("every golden listing parses and prints back byte for byte", "[parser]") {
  auto files = goldenListings();
  REQUIRE(files.size() >= 6);
  for (const auto& path : files) {
    INFO(path);
    std::string text = testing::readFile(path);
    CHECK(printListing(parseListing(text)) == text);
  }
}

TEST_CASE("a JSON dump survives the listing: print, parse, write is the dump", "[parser]") {
  for (const char* name : {"expand/cnn.sgd.json", "unroll/mlp.adam.json", "inspect/lm.json"}) {
    INFO(name);
    std::string json = testing::readFile(std::string(SPMD_SOURCE_DIR) + "/tests/golden/" + name);
    Graph g = readGraphJson(json);
    std::string listing = printListing(g);
    CHECK(writeGraphJson(parseListing(listing)) == json);
  }
}

TEST_CASE("the listing keeps odd names, escaped strings, the weights format, flags and buckets", "[parser]") {
  Graph g;
  g.setWeights({"dir with space/w.pt", "torch.save"});
  g.setFlags({{"--lr", "3e-04"}, {"--cudagraphs"}, {"--ignore-param", "it's {a} b"}, {"--ignore-param", ""}});
  ValueId x = g.addInput({"x y", c10::ScalarType::Float, {2, 3}}, InputKind::Data);
  ValueId w = g.addInput({"w", c10::ScalarType::Float, {3}}, InputKind::Parameter, false);
  Node sum;
  sum.op = "aten::sum";
  sum.overload = "dim_IntList";
  Arg dims;
  dims.kind = Arg::Kind::Ints;  // empty: only the schema tells it is int[]
  sum.args = {Arg::tensor(x), dims, Arg::ofBool(false), Arg::none()};
  sum.outputs = {g.addValue({"s\"1", c10::ScalarType::Float, {2, 3}})};
  sum.meta.source = "a file.py:3";
  sum.meta.role = NodeRole::Forward;
  sum.meta.bucket = 1;
  g.addNode(sum);
  Node red;
  red.op = "spmd::all_reduce";
  Arg how;
  how.kind = Arg::Kind::Str;
  how.s = "me\"an\\\n";
  red.args = {Arg::tensor(w), how};
  red.outputs = {g.addValue({"r", c10::ScalarType::Float, {3}})};
  g.addNode(red);
  g.addOutput(g.nodes()[0].outputs[0]);
  g.addGradient({w, w, g.nodes()[1].outputs[0]});
  g.setBuckets({Bucket{{w}, 12}, Bucket{{}, 0}});
  std::string listing = printListing(g);
  INFO(listing);
  CHECK(listing.find("graph {weights: dir with space/w.pt, format: torch.save} {flags: --lr 3e-04 --cudagraphs "
                     "--ignore-param 'it'\\''s {a} b' --ignore-param ''}\n") == 0);
  CHECK(listing.find("  input %\"x y\": f32[2,3] data\n") != std::string::npos);
  CHECK(listing.find("  bucket 0: 12 bytes (%w)\n  bucket 1: 0 bytes ()\n") != std::string::npos);
  Graph back = parseListing(listing);
  CHECK(printListing(back) == listing);
  CHECK(writeGraphJson(back) == writeGraphJson(g));
  CHECK(back.nodes()[0].args[1].kind == Arg::Kind::Ints);
  CHECK(back.nodes()[1].args[1].s == how.s);
  CHECK(back.nodes()[0].meta.source == "a file.py:3");
  CHECK(back.flags() == g.flags());
}

TEST_CASE("comments, blank lines and every constant kind parse", "[parser]") {
  const std::string text =
      "// RUN: spmd-opt %s\n"
      "\n"
      "graph {unrolled: 3 iterations}\n"
      "  // CHECK: a comment between statements\n"
      "  input %x: f32[2,3] data\n"
      "  %full: f32[2,3] = aten::full([2, 3], 1.5, torch.float32, torch.strided, device(\"cpu\"), False)\n"
      "  %c: f32[2,3] = aten::clone(%x, torch.contiguous_format)  # role=forward iteration=last\n"
      "  %cat: f32[4,3] = aten::cat([%full, %c], 0)\n"
      "  %m: f32[4,3] = aten::mul.Scalar(%cat, -inf)\n"
      "  return (%m)\n";
  Graph g = parseListing(text);
  CHECK(g.iters() == 3);
  REQUIRE(g.nodes().size() == 4);
  const Node& full = g.nodes()[0];
  CHECK(full.args[0].kind == Arg::Kind::Ints);
  CHECK(full.args[1].kind == Arg::Kind::Float);
  CHECK(full.args[2].kind == Arg::Kind::DType);
  CHECK(full.args[3].kind == Arg::Kind::Layout);
  CHECK(full.args[4].kind == Arg::Kind::Device);
  CHECK(full.args[4].s == "cpu");
  CHECK(g.nodes()[1].args[1].kind == Arg::Kind::MemoryFormat);
  CHECK(g.nodes()[1].meta.iteration == IterationTag::LastOnly);
  CHECK(g.nodes()[2].args[0].kind == Arg::Kind::Values);
  CHECK(std::isinf(g.nodes()[3].args[1].f));
  // The printed form drops only the comments and blank lines.
  std::string printed = printListing(g);
  CHECK(printed.find("graph {unrolled: 3 iterations}\n  input %x: f32[2,3] data\n") == 0);
  CHECK(printListing(parseListing(printed)) == printed);
}

TEST_CASE("bad listings name LINE:COL and what was expected", "[parser]") {
  const std::string head = "graph\n  input %x: f32[2] data\n";
  CHECK(parseError(head + "  %r: f32[2] = aten::relu(%x9)\n  return (%r)\n") == "3:27: unknown value '%x9'");
  CHECK(parseError("graph\n  input %x: q32[2] data\n  return (%x)\n") == "2:13: unknown dtype 'q32'");
  CHECK(parseError("graph {flags: lr 0.1}\n  input %x: f32[2] data\n  return (%x)\n") ==
        "1:15: bad {flags: ...}: expected a flag such as --lr, got 'lr'");
  CHECK(parseError("graph {flags: --lr 'x}\n  input %x: f32[2] data\n  return (%x)\n") ==
        "1:20: unterminated quote in {flags: ...}");
  CHECK(parseError("graph {flags: --lr 0.1\n  input %x: f32[2] data\n  return (%x)\n") ==
        "1:23: expected '}' closing {flags: ...}");
  CHECK(parseError(head + "  input %x: f32[3] data\n  return (%x)\n") == "3:9: value '%x' defined twice");
  CHECK(parseError(head + "  %r: f32[2] = aten::relu(%x\n") ==
        "3:29: expected ',' or ')' after an argument, got end of line");
  CHECK(parseError(head + "  %r: f32[2\n") == "3:12: expected ',' or ']' in the shape, got end of line");
  CHECK(parseError(head + "  %r: f32[2] = aten::frobnicate(%x)\n  return (%r)\n") ==
        "3:16: unknown operator 'aten::frobnicate'");
  CHECK(parseError(head + "  %r: f32[2] = aten::relu(%x)  # role=sideways\n  return (%r)\n") ==
        "3:39: unknown role 'sideways' (forward, backward, optimizer, comm)");
  CHECK(parseError(head) == "2:1: expected 'return (...)' before the end of input");
  CHECK(parseError("// only a comment\n") == "1:1: expected 'graph', got end of input");
  CHECK(parseError("graph\n  output %x\n") ==
        "2:3: expected 'input', a node ('%name: type = op(...)'), 'return', 'update', 'gradient' or 'bucket', got "
        "'output'");
  CHECK(parseError(head + "  return (%x)\n  bucket 1: 8 bytes (%x)\n") ==
        "4:10: expected bucket 0 (buckets are numbered in order)");
  CHECK(parseError(head + "  return (%x)\n  %r: f32[2] = aten::relu(%x)\n") == "4:3: node after 'return'");
}

TEST_CASE("a listing file's errors read FILE:LINE:COL", "[parser]") {
  Diagnostic d("3:27", "unknown value '%x9'");
  d.inFile("test.spmd");
  CHECK(d.format() == "test.spmd:3:27: unknown value '%x9'");
  Diagnostic json("/nodes/1", "unknown value 'x9'");
  json.inFile("g.json");
  CHECK(json.format() == "g.json: /nodes/1: unknown value 'x9'");
}

TEST_CASE("the parser never crashes on mangled listings", "[parser]") {
  std::string text = testing::readFile(std::string(SPMD_SOURCE_DIR) + "/tests/golden/unroll/cnn.sgd.txt");
  // Every prefix of a few lines, and every line with one character dropped.
  size_t cut = 0;
  for (int i = 0; i < 40; ++i) cut = text.find('\n', cut + 1);
  std::string part = text.substr(0, cut + 1);
  int errors = 0;
  for (size_t n = 0; n < part.size(); n += 7) {
    try {
      parseListing(part.substr(0, n));
    } catch (const Diagnostic&) {
      ++errors;
    }
    std::string dropped = part;
    dropped.erase(n, 1);
    try {
      parseListing(dropped);
    } catch (const Diagnostic&) {
      ++errors;
    }
  }
  CHECK(errors > 0);
}

// The pass manager's statistics, former pass names and spmd-opt's
// --verify-diagnostics checks (pipelines/expected_notes.h).
#include "spmd/ir/parser.h"
#include "spmd/ir/rewrite.h"
#include "spmd/passes/pass.h"
#include "spmd/pipelines/expected_notes.h"
#include "spmd/support/diagnostic.h"

#include <sstream>

#include "catch.h"  // after LibTorch's headers (see catch.h)

using namespace spmd;

namespace {

// Two LayerNorms: one over the last dimension (rewritten), one over two (not).
const char* kTwoLayerNorms = R"(graph
  input %x: f32[4,8] data
  input %w: f32[8] parameter
  input %b: f32[8] parameter
  input %x2: f32[4,2,8] data
  input %w2: f32[2,8] parameter
  %y: f32[4,8], %m: f32[4,1], %r: f32[4,1] = aten::native_layer_norm(%x, [8], %w, %b, 1e-05)
  %y2: f32[4,2,8], %m2: f32[4,1,1], %r2: f32[4,1,1] = aten::native_layer_norm(%x2, [2, 8], %w2, %w2, 1e-05)
  return (%y, %y2)
)";

int64_t statistic(const std::vector<PassStatistics>& report, const std::string& pass, const std::string& what) {
  for (const PassStatistics& p : report) {
    if (p.pass != pass) continue;
    for (const PassStatistic& s : p.statistics) {
      if (s.what == what) return s.value;
    }
  }
  return -1;
}

}  // namespace

TEST_CASE("runPasses reports what each pass counted, and notes it once", "[passes]") {
  Graph g = parseListing(kTwoLayerNorms);
  DiagnosticEngine diagnostics;
  PipelineOptions options;
  options.diagnostics = &diagnostics;
  std::ostringstream log;
  DebugOptions debug;
  debug.passStatistics = true;
  debug.log = &log;
  const auto report = runPasses(g, {"layer-norm-to-kernel", "dce"}, options, debug);
  REQUIRE(report.size() == 2);
  CHECK(report[0].pass == "layer-norm-to-kernel");
  CHECK(statistic(report, "layer-norm-to-kernel", "LayerNorm(s) as generated kernels") == 1);
  CHECK(statistic(report, "layer-norm-to-kernel", "backward(s) as generated kernels") == 0);
  CHECK(report[1].statistics.empty());
  // The failure's note, then the counts' one note.
  REQUIRE(diagnostics.notes().size() == 2);
  CHECK(diagnostics.notes()[1].message().rfind("layer-norm-to-kernel: 1 LayerNorm(s) as generated kernels, 0 backward(s)", 0) == 0);
  CHECK(log.str().find("layer-norm-to-kernel\n  1  LayerNorm(s) as generated kernels\n") != std::string::npos);
}

TEST_CASE("a pass's former name runs it, with a note", "[passes]") {
  REQUIRE(findPass("fuse-layer-norm") == findPass("layer-norm-to-kernel"));
  CHECK(findPass("fused_adam") == nullptr);
  Graph g = parseListing(kTwoLayerNorms);
  DiagnosticEngine diagnostics;
  PipelineOptions options;
  options.diagnostics = &diagnostics;
  const auto report = runPasses(g, {"fuse-layer-norm"}, options, DebugOptions{});
  CHECK(report.at(0).pass == "layer-norm-to-kernel");
  REQUIRE(!diagnostics.notes().empty());
  CHECK(diagnostics.notes()[0].message() ==
        "pass 'fuse-layer-norm' is now called 'layer-norm-to-kernel'; the old name is taken until the next release");
}

TEST_CASE("expected notes: each note expected, each expectation met", "[passes]") {
  const std::string text = std::string(kTwoLayerNorms) +
                           "// expected-note@* {{1 LayerNorm(s)}}\n"
                           "// expected-note@-3 {{not fused: it normalizes more than the last dimension}}\n";
  Graph g = parseListing(text);
  markListingLines(g, text);
  CHECK(g.nodes()[1].meta.source == "line 8");
  DiagnosticEngine diagnostics;
  PipelineOptions options;
  options.diagnostics = &diagnostics;
  runPasses(g, {"layer-norm-to-kernel"}, options, DebugOptions{});
  const auto expected = parseExpectedNotes(text);
  REQUIRE(expected.size() == 2);
  CHECK(expected[0].line == 0);
  CHECK(expected[1].line == 8);
  CHECK(unmetNoteExpectations(expected, diagnostics.notes()).empty());

  // A note about another line is not the expected one, and both are reported.
  const auto wrongLine = parseExpectedNotes("//\n// expected-note@+2 {{not fused}}\n");
  const auto unmet = unmetNoteExpectations(wrongLine, {diagnostics.notes()[0]});
  REQUIRE(unmet.size() == 2);
  CHECK(unmet[0] == "2: expected note not given: not fused");
  CHECK(unmet[1].rfind("8: note not expected: layer-norm-to-kernel: not fused", 0) == 0);
}

TEST_CASE("expected notes: a malformed expectation names its place", "[passes]") {
  CHECK_THROWS_WITH(parseExpectedNotes("graph\n  // expected-note@+x {{a}}\n"),
                    Catch::Matchers::ContainsSubstring("'@+N', '@-N' or '@*'"));
  try {
    parseExpectedNotes("\n// expected-note no braces\n");
    FAIL("no error");
  } catch (const Diagnostic& d) {
    CHECK(d.where() == "2:17");
  }
  Graph g = parseListing(kTwoLayerNorms);
  CHECK_THROWS_AS(markListingLines(g, "{\"format\": \"spmd-graph\"}"), Diagnostic);
}

TEST_CASE("patterns read arguments by their schema names", "[passes]") {
  const OpName sum = OpName::known("aten::sum.dim_IntList");
  CHECK(argumentIndex(sum, "self") == 0);
  CHECK(argumentIndex(sum, "keepdim") == 2);
  CHECK(argumentIndex(OpName::known("aten::native_layer_norm"), "eps") == 4);
  CHECK_THROWS_WITH(argumentIndex(sum, "keep_dim"),
                    Catch::Matchers::ContainsSubstring("aten::sum.dim_IntList has no argument 'keep_dim'"));
  const Graph g = parseListing(kTwoLayerNorms);
  CHECK(argument(g.nodes()[0], "eps").f == 1e-05);
  CHECK(argument(g.nodes()[1], "normalized_shape").ints == std::vector<int64_t>{2, 8});
}

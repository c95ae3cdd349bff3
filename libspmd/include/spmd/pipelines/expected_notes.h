// spmd-opt --verify-diagnostics, as mlir-opt's: a per-pass test states the
// notes it expects beside the case that causes them,
//
//   // expected-note@+1 {{layer-norm-to-kernel: not fused: it normalizes more than the last dimension}}
//   %y: f32[4,8], ... = aten::native_layer_norm(%x, [4, 8], %w, %b, 1e-05)
//
// and every note the passes give must be expected, and every expectation
// met. `@+N` / `@-N` point N lines below / above the comment, no `@` at its
// own line, `@*` anywhere (notes about no node: a pass's counts).
#pragma once

#include "spmd/ir/graph.h"
#include "spmd/support/diagnostic.h"

#include <string>
#include <vector>

namespace spmd {

struct ExpectedNote {
  int line = 0;          // the line the note must point at; 0 for `@*`
  std::string text;      // what the note's message must contain
  int commentLine = 0;   // where the expectation is written
};

// The `expected-note` comments of `text` (the whole file, so that lines are
// the file's). Throws Diagnostic "LINE:COL" on a malformed one.
std::vector<ExpectedNote> parseExpectedNotes(const std::string& text);

// Gives each node of `graph`, parsed from the listing `text`, the source
// "line N" of its statement, which notes then name.
void markListingLines(Graph& graph, const std::string& text);

// One line per mismatch, in line order: "LINE: expected note not given:
// TEXT" and "LINE: note not expected: MESSAGE" (line 0 for a note that
// names no line: printed as "*").
std::vector<std::string> unmetNoteExpectations(const std::vector<ExpectedNote>& expected,
                                               const std::vector<Diagnostic>& notes);

}  // namespace spmd

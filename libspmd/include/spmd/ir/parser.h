// Reading the listing back: the exact text printListing (ir/printer.h)
// writes, so that per-pass tests can be written as small text graphs and
// every listing round-trips (parse then print gives the same bytes).
#pragma once

#include "spmd/ir/graph.h"

#include <string>
#include <vector>

namespace spmd {

// Parses a listing:
//   graph {weights: samples/mlp.pt} {unrolled: 4 iterations}
//     input %x: f32[100,100] data
//     input %w: f32[100,100] parameter [frozen]
//     %mm: f32[100,100], _ = aten::op.overload(%x, [1, 2], None)  # models.py:3 role=forward bucket=0
//     return (%mm)
//     update %buf <- %new
//     gradient %w = %g, reduced %r
//     bucket 0: 40000 bytes (%w)
// Blank lines and lines starting with `//` are comments. An empty list `[]`
// takes its kind from the operator's schema. Throws Diagnostic with `where`
// "LINE:COL" (1-based) on any error; the graph is not verified here.
Graph parseListing(const std::string& text);

// The 1-based line of each node statement of a listing, in program order
// (the order of the parsed graph's nodes). Throws as parseListing.
std::vector<int> listingNodeLines(const std::string& text);

// Whether `text` looks like a listing: its first line that is not blank or
// a `//` comment starts with the word `graph`.
bool looksLikeListing(const std::string& text);

}  // namespace spmd

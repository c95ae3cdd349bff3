// Human-readable forms of a graph: the FX-like listing, Graphviz, and stats.
#pragma once

#include "spmd/ir/graph.h"
#include "spmd/support/text.h"  // floatText, which the listing writes numbers with

#include <string>

namespace spmd {

// One line per input, node, output and state update:
//   %linear: f32[100,100] = aten::linear(%x, %mod.0.weight, %mod.0.bias)  # models.py:25
std::string printListing(const Graph& graph);

// A Graphviz digraph: inputs as ellipses, ops as boxes, edges labelled with shapes.
std::string printDot(const Graph& graph);

// Node counts by op and by role, input counts and parameter bytes.
std::string printStats(const Graph& graph);

// The flags the stages recorded (Graph::flags()) as one shell command line,
// words quoted where the shell would split them: "--optimizer adam --lr
// 0.001 ...". "" when none were recorded.
std::string printFlags(const Graph& graph);

// The bucket plan: index, bytes and parameters per bucket, as a table or JSON;
// for a sharded step (spmd-split --shard) also the bytes of the parameters'
// shards one rank holds ("shard bytes", "shard_bytes").
std::string printBuckets(const Graph& graph);
std::string printBucketsJson(const Graph& graph);

// "f32[100,100]"
std::string typeText(const Value& v);

}  // namespace spmd

// A static memory plan for one step of a graph: every value that owns memory
// gets an offset in one arena, and values whose lifetimes do not overlap
// share addresses (greedy by size, as TFLite's arena planner does).
#pragma once

#include "spmd/ir/graph.h"

#include <cstdint>
#include <string>
#include <vector>

namespace spmd {

// One value's place in the arena. `first` and `last` are node indices: the
// node that defines the value and the last node that reads it (directly or
// through a view of it); the buffer is live on [first, last], both included.
struct BufferAssignment {
  ValueId value = kNoValue;
  int64_t offset = 0;
  int64_t bytes = 0;
  int first = 0;
  int last = 0;
};

struct MemoryPlan {
  // One per node output that owns memory (views, graph inputs and empty
  // tensors own none), in execution order: by `first`, then value id.
  std::vector<BufferAssignment> buffers;
  int64_t peakBytes = 0;       // arena size the plan needs: max(offset + bytes)
  int64_t liveBytesBound = 0;  // max over nodes of the bytes live there: no plan needs less
  int64_t unplannedBytes = 0;  // sum of all buffers' bytes: what a plan without reuse needs
  int64_t inputBytes = 0;      // graph inputs (parameters, buffers, state, data), owned by the runner
};

// What one rank holds of the model's training state, in bytes: the
// parameters (graph inputs), the reduced gradients the optimizer reads (a
// sharded step's are this rank's shards) and the optimizer state (inputs
// such as exp_avg). A sharded step (spmd-split --shard) holds less of each
// but the parameters.
struct ModelStateBytes {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizerState = 0;
};
ModelStateBytes modelStateBytes(const Graph& graph);

// The value whose memory `v` shares, as the plan resolves views and results
// that may be views (reshape, contiguous): `v` itself when it owns its memory.
ValueId memoryBaseOf(const Graph& graph, ValueId v);
// Whether every result of `node` is a view of an argument, never a copy.
bool makesViewsOnly(const Node& node);

// The plan for `graph`, executed in node order; sizes are rounded up to 512
// bytes as CUDA's caching allocator rounds them. Deterministic. The graph
// must verify (every op resolves to a schema).
MemoryPlan planMemory(const Graph& graph);

// Printed forms for spmd-inspect --memory: a summary line and the largest
// buffers as a table, or the whole plan as JSON.
std::string printMemoryPlan(const Graph& graph, const MemoryPlan& plan);
std::string printMemoryPlanJson(const Graph& graph, const MemoryPlan& plan);

}  // namespace spmd

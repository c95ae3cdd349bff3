// dce: removes the nodes whose results nothing needs: no graph output, state
// update or gradient record reaches them through other nodes. The rewriting
// passes leave what they no longer read (a transposed key, a dropout mask, a
// backward result no parameter needs) and the pipelines run this pass after
// them; no other pass removes dead nodes.
#include "spmd/passes/pass.h"

namespace spmd {
namespace {

class DcePass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine&) override { return eliminateDeadNodes(g); }
};

}  // namespace

std::unique_ptr<Pass> createDcePass(const PipelineOptions&) { return std::make_unique<DcePass>(); }

}  // namespace spmd

// check-capture (spmd-lower runs it for --cudagraphs on CUDA): finds the nodes a CUDA graph cannot hold
// (kernels that wait for a result on the host) and notes each, since
// spmd-run then runs that step eagerly. Changes nothing in the graph.
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"
#include "spmd/ops/op_traits.h"

namespace spmd {

namespace {

class CheckCapturePass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      if (syncsWithHost(n.op)) {
        diagnostics.note("/nodes/" + std::to_string(i),
                         n.qualifiedName() + " waits for a result on the host; spmd-run runs the step without CUDA graphs");
      }
    }
    return false;
  }
};

}  // namespace

std::unique_ptr<Pass> createCheckCapturePass(const PipelineOptions&) { return std::make_unique<CheckCapturePass>(); }


}  // namespace spmd

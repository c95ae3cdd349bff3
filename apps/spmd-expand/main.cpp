// spmd-expand: a forward graph whose first output is the loss becomes one
// data-parallel training step (forward, backward, gradient all-reduce,
// optimizer update), written as a JSON graph dump.
#include "spmd/pipelines/pipelines.h"
#include "spmd/io/graph_json.h"
#include "spmd/io/load.h"
#include "spmd/passes/derivatives.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <iostream>
#include <sstream>

namespace {

// "0.9,0.999" -> the two betas; throws Diagnostic.
void parseBetas(const std::string& text, spmd::OptimizerOptions& o) {
  std::istringstream in(text);
  char comma = 0;
  if (!(in >> o.beta1 >> comma >> o.beta2) || comma != ',' || !in.eof()) {
    throw spmd::Diagnostic("--betas '" + text + "'", "expected two numbers B1,B2");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string tool = "spmd-expand";
  CLI::App app{"Expand a forward graph (first output: the loss) into a data-parallel training step."};
  std::string in = "-", out = "-", optimizer, gradReduce = "mean", betas, dumpDir;
  std::vector<std::string> inputSpecs;
  spmd::OptimizerOptions o;
  bool printIr = false, listPasses = false;
  app.add_option("IN", in, "TorchScript module or JSON graph dump, '-' for stdin")->capture_default_str();
  app.add_option("-o,--output", out, "output JSON graph dump, '-' for stdout")->capture_default_str();
  app.add_option("--input", inputSpecs, "NAME:DTYPE[d0,d1,...] per-rank shape of a forward argument (TorchScript)");
  auto* optimizerOpt = app.add_option("--optimizer", optimizer, "sgd, adam or adamw");
  auto* lr = app.add_option("--lr", o.lr, "learning rate (torch.optim's default for adam/adamw: 1e-3)");
  auto* momentum = app.add_option("--momentum", o.momentum, "sgd: momentum (0)");
  auto* dampening = app.add_option("--dampening", o.dampening, "sgd: dampening (0)");
  auto* nesterov = app.add_flag("--nesterov", o.nesterov, "sgd: Nesterov momentum");
  auto* weightDecay = app.add_option("--weight-decay", o.weightDecay, "weight decay (0; adamw: 1e-2)");
  auto* betasOpt = app.add_option("--betas", betas, "adam/adamw: B1,B2 (0.9,0.999)");
  auto* eps = app.add_option("--eps", o.eps, "adam/adamw: epsilon (1e-8)");
  auto* amsgrad = app.add_flag("--amsgrad", o.amsgrad, "adam/adamw: AMSGrad");
  app.add_option("--grad-reduce", gradReduce, "mean (DDP) or sum (_spmd) over ranks")
      ->check(CLI::IsMember({"mean", "sum"}))
      ->capture_default_str();
  app.add_flag("--print-ir-after-all", printIr, "print the listing after every pass on stderr");
  app.add_option("--dump-dir", dumpDir, "write NNNN.after_<pass>.txt for every pass into DIR");
  app.add_flag("--list-passes", listPasses, "list the passes and exit");
  bool listOps = false;
  app.add_flag("--list-ops", listOps, "list the differentiable ops and exit");

  return spmd::runTool(tool, app, argc, argv, [&] {
    if (listPasses) {
      std::cout << spmd::listPasses();
      return 0;
    }
    if (listOps) {
      for (const auto& op : spmd::differentiableOps()) std::cout << op << "\n";
      return 0;
    }
    if (!*optimizerOpt) throw spmd::Diagnostic("--optimizer", "required: sgd, adam or adamw");
    if (!spmd::parseOptimizerKind(optimizer, o.kind)) {
      throw spmd::Diagnostic("--optimizer", "unknown optimizer '" + optimizer + "' (sgd, adam, adamw)");
    }
    const bool isSgd = o.kind == spmd::OptimizerKind::Sgd;
    for (auto* flag : {momentum, dampening, nesterov}) {
      if (*flag && !isSgd) throw spmd::Diagnostic(flag->get_name(), "applies to --optimizer sgd only");
    }
    for (auto* flag : {betasOpt, eps, amsgrad}) {
      if (*flag && isSgd) throw spmd::Diagnostic(flag->get_name(), "applies to --optimizer adam and adamw only");
    }
    if (isSgd && !*lr) throw spmd::Diagnostic("--lr", "required for sgd, as torch.optim.SGD requires lr");
    if (o.kind == spmd::OptimizerKind::AdamW && !*weightDecay) o.weightDecay = 1e-2;
    if (*betasOpt) parseBetas(betas, o);
    spmd::validateOptimizer(o);

    spmd::PipelineOptions options;
    options.optimizer = o;
    options.gradReduce = gradReduce == "sum" ? spmd::GradReduce::Sum : spmd::GradReduce::Mean;
    spmd::DebugOptions debug;
    debug.printIrAfterAll = printIr;
    debug.dumpDir = dumpDir;
    debug.log = &std::cerr;

    auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
    spmd::runStage(loaded, spmd::expandPipeline(options), options, debug);
    spmd::writeOutput(out, spmd::writeGraphJson(loaded.graph));
    return 0;
  });
}

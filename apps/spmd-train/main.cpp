// spmd-train: one command from a model and a TOML file to a run: the model
// exported (a Python function) or read (.pt2, TorchScript, a dump), compiled
// through the four stages in one process, and run by spmd-run's code, locally
// or as a launcher's rank. The command line overrides the file.
#include "spmd/driver/config.h"
#include "spmd/driver/python_export.h"
#include "spmd/driver/run.h"
#include "spmd/io/artifact.h"
#include "spmd/io/folder.h"
#include "spmd/io/graph_json.h"
#include "spmd/io/load.h"
#include "spmd/pipelines/compile.h"
#include "spmd/pipelines/flags.h"
#include "spmd/pipelines/lower.h"
#include "spmd/runtime/launch.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <iostream>
#include <optional>

namespace {

const std::string kTool = "spmd-train";

struct ModelFlags {
  std::string file;
  spmd::PythonModel python;
  std::vector<std::string> inputs;
};

void addModelFlags(CLI::App& group, ModelFlags& m) {
  group.add_option("--file", m.file, "the model: a torch.export program (.pt2), TorchScript module or JSON dump");
  group.add_option("--module", m.python.module,
                   "the model as Python: a .py file whose --function builds it (with --function)");
  group.add_option("--function", m.python.function,
                   "the --module's function: () -> (model, example inputs); its forward returns the loss")
      ->default_str("make");
  group.add_option("--python", m.python.python, "the Python that exports --module (its torch's torch.export)")
      ->capture_default_str();
  group.add_option("--input", m.inputs, "NAME:DTYPE[d0,d1,...] per-rank shape of a forward argument (TorchScript)");
}

// train.toml -> train.
std::string defaultDir(const std::string& config) {
  const size_t slash = config.rfind('/');
  std::string base = slash == std::string::npos ? config : config.substr(slash + 1);
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".toml") == 0) base.resize(base.size() - 5);
  return base + ".run";
}

// The model file to compile: [model] file, or --module exported into DIR.
// Under a launcher every rank exports its own copy (the same program); only
// rank 0 keeps it as DIR/model.pt2.
std::string modelFile(ModelFlags& m, const std::string& dir, bool writer, int rank) {
  if (!m.file.empty() && !m.python.module.empty()) {
    throw spmd::Diagnostic("", "give file or module, not both");
  }
  if (!m.file.empty()) return m.file;
  if (m.python.module.empty()) throw spmd::Diagnostic("", "no model: give file (a .pt2) or module (a .py)");
  if (m.python.function.empty()) m.python.function = "make";
  const std::string out = dir + (writer ? "/model.pt2" : "/.model-rank" + std::to_string(rank) + ".pt2");
  spmd::exportPythonModel(m.python, out);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a model from a TOML file in one command: export it (Python), compile it (spmd-expand, "
               "spmd-split, spmd-unroll, spmd-lower in one process) and run it (spmd-run)."};
  app.footer("Examples:\n"
             "  spmd-train train.toml\n"
             "  spmd-train train.toml --lr 3e-4 --steps 2000 --nproc 2\n"
             "  torchrun --nproc_per_node 8 --no_python spmd-train train.toml   (each rank compiles; rank 0 writes DIR)\n"
             "The file's tables [model], [compile] and [run] take the flags of the groups below as keys, without the "
             "dashes (lr = 3e-4, lr-schedule = \"cosine\", input = [\"x:f32[8,100]\"]); the command line wins.");
  std::string config, dir, artifactFile;
  bool printConfig = false, compileOnly = false, keepStages = false;
  app.add_option("CONFIG", config, "the run's TOML file")->required();
  app.add_option("--dir", dir, "where the run's files go: model.pt2, step.spmd, config.toml (default: CONFIG's name "
                               "with .run for .toml)");
  app.add_flag("--print-config", printConfig, "print the resolved configuration (file and command line) and exit");
  app.add_flag("--compile-only", compileOnly, "write DIR's files and stop before the run");
  app.add_option("--artifact", artifactFile,
                 "run this artifact with the file's [run] settings instead of compiling (local ranks get DIR's)");

  ModelFlags model;
  addModelFlags(*app.add_option_group("model", "[model]: the model"), model);

  spmd::CompileOptions compile;
  spmd::StageFlags stageFlags;
  CLI::App& compileGroup = *app.add_option_group("compile", "[compile]: spmd-compile's flags");
  spmd::addStageFlags(compileGroup, compile.pipeline, stageFlags);
  // One --device for both: the step is lowered for where it runs ([run] device).
  compileGroup.remove_option(compileGroup.get_option("--device"));
  compileGroup.add_flag("--keep-stages", keepStages,
                        "also write DIR/stages/expand.json, split.json and unroll.json (the stages' outputs)");

  spmd::RunOptions run;
  spmd::RunFlags runFlags;
  spmd::addRunFlags(*app.add_option_group("run", "[run]: spmd-run's flags"), run, runFlags);

  // --checkpoint-every in the file and --checkpoint on the command line (or
  // the other way round) meet only once the file is applied.
  const std::vector<spmd::Requirement> requirements = spmd::deferRequirements(app);
  const std::vector<std::string> args(argv, argv + argc);
  return spmd::runTool(kTool, app, argc, argv, [&] {
    spmd::applyConfig(app, spmd::readConfigFile(config));
    spmd::checkRequirements(requirements);
    if (printConfig) {
      std::cout << spmd::resolvedConfig(app, {"model", "compile", "run"});
      return 0;
    }
    if (dir.empty()) dir = defaultDir(config);
    // [run] eval-every (or eval-data, eval-tokens) without an eval file: the
    // evaluation step is compiled here, beside the training step.
    const bool compileEval = run.evalArtifact.empty() && (!run.evalData.empty() || !run.evalTokens.empty());
    if (compileEval) run.evalArtifact = dir + "/eval.spmd";
    spmd::finishRunFlags(runFlags, run);
    run.config = spmd::resolvedConfig(app, {"model", "compile", "run"});
    if (!run.resume.empty() && !run.resumeWeightsOnly) spmd::requireSameCompileConfig(run.resume, run.config);
    if (!artifactFile.empty()) {
      const auto load = [&] {
        auto loaded = spmd::loadGraph(artifactFile, {});
        return spmd::artifactOf(loaded, spmd::loweringDevice(run.device));
      };
      return spmd::runAsRank(kTool, load, artifactFile, run, runFlags, args);
    }
    const auto rank = spmd::rankFromEnvironment();
    const bool writer = !rank || rank->rank == 0;
    spmd::DiagnosticEngine diagnostics = writer ? spmd::printingDiagnostics(kTool) : spmd::DiagnosticEngine();
    compile.pipeline.diagnostics = &diagnostics;
    spmd::finishStageFlags(stageFlags, compile.pipeline, /*optimizerRequired=*/true);
    compile.pipeline.lower.device = spmd::loweringDevice(run.device);
    spmd::makeFolder(dir, "--dir");
    std::vector<std::pair<std::string, std::string>> stages;
    if (keepStages && writer) {
      compile.afterStage = [&](spmd::Stage stage, const spmd::Graph& graph) {
        stages.emplace_back(dir + "/stages/" + spmd::stageName(stage) + ".json", spmd::writeGraphJson(graph));
      };
    }
    std::string file;
    try {
      file = modelFile(model, dir, writer, rank ? rank->rank : 0);
    } catch (const spmd::Diagnostic& d) {  // the config's [model] is the place
      throw spmd::Diagnostic(d.where().empty() ? "[model]" : d.where(), d.message()).inFile(config);
    }
    auto loaded = spmd::loadGraph(file, spmd::parseInputSpecs(model.inputs));
    spmd::Artifact artifact = spmd::compileGraph(loaded, compile);
    std::optional<spmd::Artifact> evalArtifact;
    if (compileEval) {
      spmd::CompileOptions evalOptions = compile;
      evalOptions.evalStep = true;
      evalOptions.afterStage = nullptr;
      auto forward = spmd::loadGraph(file, spmd::parseInputSpecs(model.inputs));
      evalArtifact = spmd::compileGraph(forward, evalOptions);
    }
    if (!writer && file != model.file) std::remove(file.c_str());  // this rank's own export, not the user's file
    const std::string artifactPath = dir + "/step.spmd";
    if (writer) {
      if (!stages.empty()) spmd::makeFolder(dir + "/stages", "--dir");
      for (const auto& [path, text] : stages) spmd::writeOutput(path, text);
      spmd::writeArtifact(artifact, artifactPath);
      if (evalArtifact) spmd::writeArtifact(*evalArtifact, run.evalArtifact);
      spmd::writeOutput(dir + "/config.toml", run.config);
    }
    if (evalArtifact) run.evalStep = std::make_shared<const spmd::Artifact>(std::move(*evalArtifact));
    if (compileOnly) return 0;
    if (!rank && runFlags.nproc > 1) {
      // Local ranks run what was just written, with the same settings.
      std::vector<std::string> ranks = args;
      ranks.insert(ranks.end(), {"--artifact", artifactPath});
      return spmd::launchLocalRanks(kTool, runFlags.nproc, ranks);
    }
    return spmd::runAsRank(kTool, [&] { return std::move(artifact); }, artifactPath, run, runFlags, args);
  });
}

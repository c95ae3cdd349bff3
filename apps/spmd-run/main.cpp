// spmd-run: runs an artifact (or a graph, lowered in-process) on N ranks.
#include "spmd/io/artifact.h"
#include "spmd/io/load.h"
#include "spmd/runtime/errors.h"
#include "spmd/runtime/launch.h"
#include "spmd/pipelines/lower.h"
#include "spmd/runtime/runner.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <iostream>

int main(int argc, char** argv) {
  const std::string tool = "spmd-run";
  CLI::App app{"Run a compiled training step on N data-parallel ranks (Gloo on CPU, NCCL on CUDA)."};
  std::string in;
  int nproc = 0;
  double timeoutSec = 300;
  spmd::RunOptions o;
  std::vector<std::string> inputSpecs;
  app.add_option("IN", in, "artifact from spmd-lower, or a graph (JSON/TorchScript) to lower with defaults")->required();
  app.add_option("--nproc", nproc, "spawn N local ranks (ignored under torchrun, srun or mpirun)")->check(CLI::Range(1, 1024));
  app.add_option("--steps", o.steps, "training steps (default: spmd-unroll's --iters, else 10)")->check(CLI::Range(1, 100000000));
  app.add_option("--warmup", o.warmup, "steps left out of the timing summary (they still train)")
      ->check(CLI::Range(0, 100000000))
      ->capture_default_str();
  app.add_option("--data", o.dataFile, "torch.save'd {input: tensor [S, G, ...]}; rank r takes rows [r*G/N, (r+1)*G/N) of slice s % S");
  app.add_option("--save-params", o.saveParams, "write rank 0's parameters {name: tensor} (torch.load reads it)");
  app.add_option("--metrics", o.metrics,
                 "append one JSON object per step to FILE.jsonl (step, loss, lr, grad_norm, ms, samples_per_s, "
                 "peak_bytes), flushed after each step");
  app.add_option("--device", o.device, "auto, cuda or cpu")->check(CLI::IsMember({"auto", "cuda", "cpu"}))->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the random inputs used without --data")->capture_default_str();
  app.add_flag("--json", o.json, "print the run's losses and timings as one JSON object");
  app.add_flag("--eager", o.eager, "run every step through the interpreter, even for an artifact lowered with --cudagraphs");
  app.add_option("--profile", o.profile,
                 "write rank 0's time per operator to FILE (runs eagerly, the device synchronized after every node)");
  app.add_flag("--allow-nonfinite", o.allowNonfinite, "keep training after a NaN or infinite loss (else an error naming the step)");
  app.add_flag("--tf32", o.tf32, "allow TF32 matmuls on CUDA (torch.backends.cuda.matmul.allow_tf32)");
  app.add_option("--timeout", timeoutSec, "seconds to wait for a peer (joining, or in a collective) before failing")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--input", inputSpecs, "NAME:DTYPE[d0,d1,...] for a TorchScript IN");

  return spmd::runTool(tool, app, argc, argv, [&] {
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutSec * 1000));
    auto rank = spmd::rankFromEnvironment();
    if (!rank && nproc > 1) {
      return spmd::launchLocalRanks(tool, nproc, std::vector<std::string>(argv, argv + argc), std::cerr);
    }
    // Every line a rank prints names it: several ranks share one terminal.
    const std::string prefix = rank ? "rank " + std::to_string(rank->rank) + ": " : "";
    try {
      auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
      spmd::Artifact artifact = spmd::artifactOf(loaded, spmd::loweringDevice(o.device));
      try {
        spmd::runTraining(artifact, rank && rank->worldSize > 1 ? rank : std::nullopt, o, std::cout);
      } catch (spmd::Diagnostic& d) {
        throw d.inFile(loaded.displayName);
      } catch (const spmd::KernelError& e) {
        const std::string node = "/nodes/" + std::to_string(e.node()) + " (" + e.op() + ")";
        throw spmd::Diagnostic(node, e.what()).inFile(loaded.displayName);
      }
    } catch (const spmd::Diagnostic& d) {
      spmd::printError(tool, prefix + d.format());
      return 1;
    } catch (const spmd::CollectiveError& e) {
      spmd::printError(tool, prefix + "a collective failed (did a peer stop?): " + e.what());
      return 1;
    } catch (const c10::Error& e) {
      std::string what = e.what_without_backtrace();
      spmd::printError(tool, prefix + what.substr(0, what.find('\n')));
      return 1;
    } catch (const std::exception& e) {
      std::string what = e.what();
      spmd::printError(tool, prefix + what.substr(0, what.find('\n')));
      return 1;
    }
    return 0;
  });
}

// spmd-run: runs an artifact (or a graph, lowered in-process) on N ranks.
#include "spmd/io/artifact.h"
#include "spmd/io/load.h"
#include "spmd/runtime/errors.h"
#include "spmd/runtime/launch.h"
#include "spmd/pipelines/lower.h"
#include "spmd/runtime/run_notes.h"
#include "spmd/runtime/runner.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/limits.h"
#include "spmd/support/tool.h"

#include <csignal>
#include <iostream>

namespace {

// A rank that failed on its own reports it, then ignores the launcher's
// SIGTERM: it is ending anyway, and a death by SIGTERM would hide its exit
// code 1 behind a peer's "lost a peer", the peer having seen our sockets close.
int ownFailure(const std::string& tool, const std::string& message) {
  spmd::printError(tool, message);
  std::signal(SIGTERM, SIG_IGN);
  return 1;
}

// --timeout: positive seconds, at most a day. A longer wait is a hang by
// another name, and NaN or inf would make no deadline at all.
CLI::Validator timeoutBound() {
  return CLI::Validator(
      [](const std::string& text) -> std::string {
        double seconds = 0;
        try {
          seconds = std::stod(text);
        } catch (const std::exception&) {
          return "not a number of seconds";
        }
        if (!(seconds > 0 && seconds <= 86400)) return "must be more than 0 and at most 86400 seconds (a day)";
        return "";
      },
      "SEC in (0, 86400]");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string tool = "spmd-run";
  CLI::App app{"Run a compiled training step on N data-parallel ranks (Gloo on CPU, NCCL on CUDA)."};
  app.footer("Examples:\n"
             "  spmd-run step.spmd --nproc 2 --steps 100 --data batches.pt --save-params params.pt\n"
             "  torchrun --nproc_per_node 2 --no_python spmd-run step.spmd   (as rank RANK of WORLD_SIZE)");
  std::string in;
  int nproc = 0;
  double timeoutSec = 300;
  spmd::RunOptions o;
  std::vector<std::string> inputSpecs;
  app.add_option("IN", in, "artifact from spmd-lower, or a graph (JSON/TorchScript) to lower with defaults")->required();
  app.add_option("--nproc", nproc, "spawn N local ranks (ignored under torchrun, srun or mpirun)")->check(CLI::Range(1, 1024));
  app.add_option("--steps", o.steps, "training steps (default: spmd-unroll's --iters, else 10)")->check(CLI::Range(int64_t{1}, spmd::kMaxRunSteps));
  app.add_option("--warmup", o.warmup, "steps left out of the timing summary (they still train)")
      ->check(CLI::Range(0, 100000000))
      ->capture_default_str();
  auto* dataOption = app.add_option(
      "--data", o.dataFile,
      "{input: tensor [S, G, ...] or rows [N, ...]}: a torch.save'd dict, an uncompressed .npz (numpy.savez) or a "
      "folder of NAME.npy (memory-mapped); rank r takes rows [r*G/W, (r+1)*G/W) of slice s % S");
  app.add_option("--tokens", o.tokens,
                 "a token stream (nanoGPT's train.bin, memory-mapped): the first two data inputs, integer [B, T], get "
                 "B windows of T tokens and the windows one token later, at offsets seeded by --seed, rank and step")
      ->excludes(dataOption);
  app.add_option("--token-dtype", o.tokenDtype, "uint16 or uint32 (--tokens)")
      ->check(CLI::IsMember({"uint16", "uint32"}))
      ->capture_default_str();
  app.add_option("--save-params", o.saveParams, "write rank 0's parameters {name: tensor} (torch.load reads it)");
  app.add_option("--metrics", o.metrics,
                 "append one JSON object per step to FILE.jsonl (step, loss, lr, grad_norm, ms, samples_per_s, "
                 "peak_bytes), flushed after each step");
  auto* checkpointOption = app.add_option("--checkpoint", o.checkpoint,
                 "write checkpoints into DIR (step-NNNNNNNN folders PyTorch reads, and DIR/latest): at the end, and "
                 "with --checkpoint-every K after every K-th step");
  app.add_option("--checkpoint-every", o.checkpointEvery, "steps between checkpoints (with --checkpoint)")
      ->check(CLI::Range(1, 100000000))
      ->needs(checkpointOption);
  app.add_option("--keep", o.keep, "checkpoints kept in --checkpoint's DIR, the newest")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  auto* resumeOption = app.add_option("--resume", o.resume,
                 "continue from a checkpoint (a step-NNNNNNNN folder, or a --checkpoint DIR: its latest) up to "
                 "--steps, bit for bit as an uninterrupted run");
  app.add_flag("--resume-weights-only", o.resumeWeightsOnly,
               "take only the checkpoint's parameters and buffers and start at step 1 (another artifact or world size)")
      ->needs(resumeOption);
  app.add_option("--init-from", o.initFrom,
                 "start from the parameters (and buffers) of a PyTorch state_dict file (torch.save(model.state_dict()))");
  app.add_option("--device", o.device, "auto, cuda or cpu")->check(CLI::IsMember({"auto", "cuda", "cpu"}))->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the random inputs used without --data")->capture_default_str();
  app.add_flag("--json", o.json, "print the run's losses and timings as one JSON object");
  app.add_flag("--eager", o.eager, "run every step through the interpreter, even for an artifact lowered with --cudagraphs");
  app.add_option("--profile", o.profile,
                 "write rank 0's time per operator to FILE (runs eagerly, the device synchronized after every node)");
  app.add_option("--trace", o.trace,
                 "write a PyTorch profiler (Kineto) Chrome trace of rank 0's timed steps to FILE: ATen ops and, on "
                 "CUDA, every kernel, nothing synchronized");
  app.add_flag("--allow-nonfinite", o.allowNonfinite, "keep training after a NaN or infinite loss (else an error naming the step)");
  app.add_flag("--tf32", o.tf32, "allow TF32 matmuls on CUDA (torch.backends.cuda.matmul.allow_tf32)");
  bool noCudnnTf32 = false;
  app.add_flag("--no-cudnn-tf32", noCudnnTf32,
               "cuDNN's convolutions in full fp32 (torch.backends.cudnn.allow_tf32 = False; TF32 is cuDNN's default)");
  app.add_flag("--cudnn-deterministic", o.cudnnDeterministic,
               "cuDNN's deterministic algorithms only (torch.backends.cudnn.deterministic = True)");
  app.add_option("--timeout", timeoutSec, "seconds to wait for a peer (joining, or in a collective) before failing")
      ->check(timeoutBound())
      ->capture_default_str();
  app.add_option("--input", inputSpecs, "NAME:DTYPE[d0,d1,...] for a TorchScript IN");

  return spmd::runTool(tool, app, argc, argv, [&] {
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutSec * 1000));
    o.cudnnTf32 = !noCudnnTf32;
    auto rank = spmd::rankFromEnvironment();
    if (!rank && nproc > 1) {
      return spmd::launchLocalRanks(tool, nproc, std::vector<std::string>(argv, argv + argc));
    }
    // Every line a rank prints names it: several ranks share one terminal.
    const std::string prefix = rank ? "rank " + std::to_string(rank->rank) + ": " : "";
    try {
      auto loaded = spmd::loadGraph(in, spmd::parseInputSpecs(inputSpecs));
      spmd::Artifact artifact = spmd::artifactOf(loaded, spmd::loweringDevice(o.device));
      if (!rank || rank->rank == 0) {  // once, not once per rank
        spmd::DiagnosticEngine notes = spmd::printingDiagnostics(tool);
        notes.setFile(loaded.displayName);
        spmd::noteRunOddities(artifact.graph, notes);
      }
      try {
        spmd::runTraining(artifact, rank && rank->worldSize > 1 ? rank : std::nullopt, o, std::cout);
      } catch (spmd::Diagnostic& d) {
        d.inFile(loaded.displayName);
        throw;  // as it is: a JoinError stays one
      } catch (const spmd::KernelError& e) {
        const std::string node = "/nodes/" + std::to_string(e.node()) + " (" + e.op() + ")";
        throw spmd::Diagnostic(node, e.what()).inFile(loaded.displayName);
      } catch (const c10::Error& e) {
        // Not a collective's (those are CollectiveError) nor a node's: LibTorch's
        // own words (out of memory, a device error), naming the run's file.
        const std::string what = e.what_without_backtrace();
        throw spmd::Diagnostic("", what.substr(0, what.find('\n'))).inFile(loaded.displayName);
      }
    } catch (const spmd::JoinError& d) {
      spmd::printError(tool, prefix + d.format());
      return spmd::peerFailureExitCode();
    } catch (const spmd::Diagnostic& d) {
      return ownFailure(tool, prefix + d.format());
    } catch (const spmd::CollectiveError& e) {
      spmd::printError(tool, prefix + "a collective failed (did a peer stop?): " + e.what());
      return spmd::peerFailureExitCode();
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      return ownFailure(tool, prefix + what.substr(0, what.find('\n')));
    } catch (const std::exception& e) {
      const std::string what = e.what();
      return ownFailure(tool, prefix + what.substr(0, what.find('\n')));
    }
    return 0;
  });
}

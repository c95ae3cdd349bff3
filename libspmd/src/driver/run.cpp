#include "spmd/driver/run.h"

#include "spmd/runtime/errors.h"
#include "spmd/runtime/launch.h"
#include "spmd/runtime/run_notes.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/limits.h"
#include "spmd/support/tool.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <csignal>
#include <iostream>
#include <string>

namespace spmd {
namespace {

// A rank that failed on its own reports it, then ignores the launcher's
// SIGTERM: it is ending anyway, and a death by SIGTERM would hide its exit
// code 1 behind a peer's "lost a peer", the peer having seen our sockets close.
int ownFailure(const std::string& tool, const std::string& message) {
  printError(tool, message);
  std::signal(SIGTERM, SIG_IGN);
  return 1;
}

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

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

void addRunFlags(CLI::App& app, RunOptions& options, RunFlags& flags) {
  app.add_option("--nproc", flags.nproc, "spawn N local ranks (ignored under torchrun, srun or mpirun)")->check(CLI::Range(1, 1024));
  app.add_option("--steps", options.steps, "training steps (default: spmd-unroll's --iters, else 10)")->check(CLI::Range(int64_t{1}, kMaxRunSteps));
  app.add_option("--warmup", options.warmup, "steps left out of the timing summary (they still train)")
      ->check(CLI::Range(0, 100000000))
      ->capture_default_str();
  CLI::Option* dataOption = app.add_option(
      "--data", options.dataFile,
      "{input: tensor [S, G, ...] or rows [N, ...]}: a torch.save'd dict, an uncompressed .npz (numpy.savez) or a "
      "folder of NAME.npy (memory-mapped); rank r takes rows [r*G/W, (r+1)*G/W) of slice s % S");
  app.add_option("--tokens", options.tokens,
                 "a token stream (nanoGPT's train.bin, memory-mapped): the first two data inputs, integer [B, T], get "
                 "B windows of T tokens and the windows one token later, at offsets seeded by --seed, rank and step")
      ->excludes(dataOption);
  app.add_flag("--shuffle", options.shuffle,
               "epochs over --data's rows, each in the order of a permutation seeded by --seed and the epoch (the "
               "same on every rank; a resumed run continues it)")
      ->needs(dataOption);
  app.add_option("--token-dtype", options.tokenDtype, "uint16 or uint32 (--tokens)")
      ->check(CLI::IsMember({"uint16", "uint32"}))
      ->capture_default_str();
  app.add_option("--save-params", options.saveParams, "write rank 0's parameters {name: tensor} (torch.load reads it)");
  app.add_option("--save-state-dict", options.saveStateDict,
                 "write the parameters and buffers under the module's names, as model.state_dict() holds them "
                 "(model.load_state_dict(torch.load(FILE)) takes it)");
  app.add_option("--metrics", options.metrics,
                 "append one JSON object per step to FILE.jsonl (step, loss, lr, grad_norm, ms, samples_per_s, "
                 "peak_bytes), flushed after each step");
  CLI::Option* checkpointOption = app.add_option("--checkpoint", options.checkpoint,
                 "write checkpoints into DIR (step-NNNNNNNN folders PyTorch reads, and DIR/latest): at the end, and "
                 "with --checkpoint-every K after every K-th step");
  app.add_option("--checkpoint-every", options.checkpointEvery, "steps between checkpoints (with --checkpoint)")
      ->check(CLI::Range(1, 100000000))
      ->needs(checkpointOption);
  app.add_option("--keep", options.keep, "checkpoints kept in --checkpoint's DIR, the newest")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  CLI::Option* resumeOption = app.add_option("--resume", options.resume,
                 "continue from a checkpoint (a step-NNNNNNNN folder, or a --checkpoint DIR: its latest) up to "
                 "--steps, bit for bit as an uninterrupted run");
  app.add_flag("--resume-weights-only", options.resumeWeightsOnly,
               "take only the checkpoint's parameters and buffers and start at step 1 (another artifact or world size)")
      ->needs(resumeOption);
  app.add_option("--eval", options.evalArtifact,
                 "the evaluation step (spmd-compile --eval-step): the validation loss, on --eval-data or --eval-tokens, "
                 "after every --eval-every steps and after the last, averaged over --eval-steps batches and the ranks");
  flags.evalFlags = {
      app.add_option("--eval-every", options.evalEvery, "steps between evaluations (with --eval; default: the last step only)")
          ->check(CLI::Range(1, 100000000)),
      app.add_option("--eval-steps", options.evalSteps, "batches per evaluation, the same ones each time (default 1)")
          ->check(CLI::Range(1, 1000000)),
      app.add_option("--eval-data", options.evalData, "held-out batches for --eval, in --data's contract"),
      app.add_option("--eval-tokens", options.evalTokens,
                     "a held-out token stream for --eval (nanoGPT's val.bin; --token-dtype), windows drawn as --tokens "
                     "draws them")};
  flags.evalFlags[3]->excludes(flags.evalFlags[2]);
  app.add_option("--init-from", options.initFrom,
                 "start from the parameters (and buffers) of a PyTorch state_dict file (torch.save(model.state_dict()))");
  app.add_option("--device", options.device, "auto, cuda or cpu")->check(CLI::IsMember({"auto", "cuda", "cpu"}))->capture_default_str();
  app.add_option("--seed", options.seed, "seed of the random inputs used without --data")->capture_default_str();
  app.add_flag("--json", options.json, "print the run's losses and timings as one JSON object");
  app.add_flag("--eager", options.eager, "run every step through the interpreter, even for an artifact lowered with --cudagraphs");
  app.add_option("--profile", options.profile,
                 "write rank 0's time per operator to FILE (runs eagerly, the device synchronized after every node)");
  app.add_option("--trace", options.trace,
                 "write a PyTorch profiler (Kineto) Chrome trace of rank 0's timed steps to FILE: ATen ops and, on "
                 "CUDA, every kernel, nothing synchronized");
  app.add_flag("--allow-nonfinite", options.allowNonfinite, "keep training after a NaN or infinite loss (else an error naming the step)");
  app.add_flag("--tf32", options.tf32, "allow TF32 matmuls on CUDA (torch.backends.cuda.matmul.allow_tf32)");
  app.add_flag("--no-cudnn-tf32", flags.noCudnnTf32,
               "cuDNN's convolutions in full fp32 (torch.backends.cudnn.allow_tf32 = False; TF32 is cuDNN's default)");
  app.add_flag("--cudnn-deterministic", options.cudnnDeterministic,
               "cuDNN's deterministic algorithms only (torch.backends.cudnn.deterministic = True)");
  app.add_option("--timeout", flags.timeoutSec, "seconds to wait for a peer (joining, or in a collective) before failing")
      ->check(timeoutBound())
      ->capture_default_str();
}

void finishRunFlags(const RunFlags& flags, RunOptions& options) {
  if (options.evalArtifact.empty()) {
    for (const CLI::Option* flag : flags.evalFlags) {
      if (flag && *flag) throw Diagnostic(flag->get_name(), "needs --eval FILE, the evaluation step");
    }
  } else if (options.evalData.empty() && options.evalTokens.empty()) {
    throw Diagnostic("--eval", "needs held-out data: --eval-data FILE or --eval-tokens FILE");
  }
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.timeoutSec * 1000));
  options.cudnnTf32 = !flags.noCudnnTf32;
}

}  // namespace spmd

namespace spmd {

int runAsRank(const std::string& tool, const std::function<Artifact()>& load, const std::string& file,
              const RunOptions& options, const RunFlags& flags, const std::vector<std::string>& argv) {
  auto rank = rankFromEnvironment();
  if (!rank && flags.nproc > 1) return launchLocalRanks(tool, flags.nproc, argv);
  // Every line a rank prints names it: several ranks share one terminal.
  const std::string prefix = rank ? "rank " + std::to_string(rank->rank) + ": " : "";
  try {
    const Artifact artifact = load();
    if (!rank || rank->rank == 0) {  // once, not once per rank
      DiagnosticEngine notes = printingDiagnostics(tool);
      notes.setFile(file);
      noteRunOddities(artifact.graph, notes);
    }
    RunOptions recorded = options;
    if (recorded.command.empty() && !argv.empty()) {
      recorded.command = argv;
      recorded.command.front() = tool;  // not the path it was started by
    }
    try {
      runTraining(artifact, rank && rank->worldSize > 1 ? rank : std::nullopt, recorded, std::cout);
    } catch (Diagnostic& d) {
      d.inFile(file);
      throw;  // as it is: a JoinError stays one
    } catch (const KernelError& e) {
      const std::string node = "/nodes/" + std::to_string(e.node()) + " (" + e.op() + ")";
      throw Diagnostic(node, e.what()).inFile(file);
    } catch (const c10::Error& e) {
      // Not a collective's (those are CollectiveError) nor a node's: LibTorch's
      // own words (out of memory, a device error), naming the run's file.
      throw Diagnostic("", firstLine(e.what_without_backtrace())).inFile(file);
    }
  } catch (const JoinError& d) {
    printError(tool, prefix + d.format());
    return peerFailureExitCode();
  } catch (const Diagnostic& d) {
    return ownFailure(tool, prefix + d.format());
  } catch (const CollectiveError& e) {
    printError(tool, prefix + "a collective failed (did a peer stop?): " + e.what());
    return peerFailureExitCode();
  } catch (const c10::Error& e) {
    return ownFailure(tool, prefix + firstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return ownFailure(tool, prefix + firstLine(e.what()));
  }
  return 0;
}

}  // namespace spmd

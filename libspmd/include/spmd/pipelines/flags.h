// The command-line flags of each option group, shared by the stage front
// ends and spmd-opt so that a flag means the same everywhere: each add*
// function binds CLI11 flags to an options struct (passes/options.h,
// passes/pass.h); what a group checks after parsing lives next to it.
#pragma once

#include "spmd/passes/options.h"
#include "spmd/passes/pass.h"

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace spmd {

// What the optimizer flags bind besides OptimizerOptions: the raw texts and
// which flags were given (for finishOptimizerFlags). Keep it alive, and in
// place, until parsing is done.
struct OptimizerFlags {
  std::string optimizer;
  std::string betas;
  CLI::Option* optimizerOpt = nullptr;
  CLI::Option* lr = nullptr;
  CLI::Option* momentum = nullptr;
  CLI::Option* dampening = nullptr;
  CLI::Option* nesterov = nullptr;
  CLI::Option* weightDecay = nullptr;
  CLI::Option* betasOpt = nullptr;
  CLI::Option* eps = nullptr;
  CLI::Option* amsgrad = nullptr;
};

// --optimizer sgd|adam|adamw, --lr, --momentum, --dampening, --nesterov,
// --weight-decay, --betas B1,B2, --eps, --amsgrad.
void addOptimizerFlags(CLI::App& app, OptimizerOptions& options, OptimizerFlags& flags);
// After parsing: the optimizer kind, torch.optim's defaults (AdamW's weight
// decay), --betas, flags of another optimizer rejected, torch.optim's
// validation. Without --optimizer: an error when `required`, else the
// defaults stay (Adam). Throws Diagnostic naming the flag.
void finishOptimizerFlags(const OptimizerFlags& flags, OptimizerOptions& options, bool required);

// --grad-reduce mean|sum (default mean), with the tool's help text.
void addGradReduceFlag(CLI::App& app, GradReduce& reduce, const std::string& help);

// --autocast DEVICE:DTYPE and --reduce-dtype DTYPE, as given; parsed by
// finishPrecisionFlags.
struct PrecisionFlags {
  std::string autocast;
  std::string reduceDtype;
};
void addPrecisionFlags(CLI::App& app, PrecisionFlags& flags);
// After parsing: cuda:bf16 and cpu:bf16 (cuda:fp16 is refused: it needs
// loss scaling, which spmd does not do); --reduce-dtype f32, bf16 or f16.
// Throws Diagnostic naming the flag.
void finishPrecisionFlags(const PrecisionFlags& flags, PipelineOptions& options);

// --lr-schedule constant|linear|cosine|step, --warmup-steps, --decay-steps,
// --min-lr, --step-size, --gamma, --clip-grad-norm, --clip-grad-norm-type,
// --micro-batches, as given; applied by finishTrainingFlags.
struct TrainingFlags {
  std::string schedule;
  std::string normType = "2";
  TrainingConfig config;
  CLI::Option* decaySteps = nullptr;
  CLI::Option* minLr = nullptr;
  CLI::Option* stepSize = nullptr;
  CLI::Option* gamma = nullptr;
  CLI::Option* clip = nullptr;
  CLI::Option* clipType = nullptr;
};
void addTrainingFlags(CLI::App& app, TrainingFlags& flags);
// After parsing and finishOptimizerFlags: the schedule's base rate is the
// optimizer's --lr; a constant schedule without warmup leaves the rate a
// constant of the step; flags of another schedule are rejected, as are bad
// values (validateTraining). Throws Diagnostic naming the flag.
void finishTrainingFlags(const TrainingFlags& flags, PipelineOptions& options);

// spmd-split's --bucket-cap-mb, --first-bucket-cap-mb, --ignore-param,
// --world-size, --shard.
void addBucketFlags(CLI::App& app, BucketOptions& options);

// spmd-unroll's --iters, --no-move.
void addUnrollFlags(CLI::App& app, UnrollOptions& options);

// spmd-lower's --device, --cudagraphs, --no-fuse.
void addLowerFlags(CLI::App& app, LowerOptions& options);

// --input NAME:DTYPE[d0,...] (repeatable): per-rank shapes for TorchScript.
void addInputSpecFlag(CLI::App& app, std::vector<std::string>& specs);

// The pass manager's aids: --print-ir-after-all, --print-ir-after PASS
// (repeatable; --print-ir-after=PASS too), --time-passes, --dump-dir DIR.
// Their output goes to stderr.
void addDebugFlags(CLI::App& app, DebugOptions& debug);

// Every compiling stage's flags on one command line, in the stages' order:
// spmd-expand's (optimizer, --grad-reduce, precision, training), spmd-split's,
// spmd-unroll's and spmd-lower's; for spmd-compile, spmd-opt and spmd-train.
struct StageFlags {
  OptimizerFlags optimizer;
  PrecisionFlags precision;
  TrainingFlags training;
};
void addStageFlags(CLI::App& app, PipelineOptions& options, StageFlags& flags);
// After parsing: finishOptimizerFlags, finishPrecisionFlags, finishTrainingFlags.
void finishStageFlags(const StageFlags& flags, PipelineOptions& options, bool optimizerRequired);

// --list-passes: prints the registry and exits 0 (before required flags
// are checked).
void addListPassesFlag(CLI::App& app);

}  // namespace spmd

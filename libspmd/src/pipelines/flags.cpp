#include "spmd/pipelines/flags.h"

#include "spmd/ops/dtype.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/phase_times.h"

#include <cmath>
#include <iostream>
#include <sstream>

namespace spmd {
namespace {

// "0.9,0.999" -> the two betas; throws Diagnostic.
void parseBetas(const std::string& text, OptimizerOptions& o) {
  std::istringstream in(text);
  char comma = 0;
  if (!(in >> o.beta1 >> comma >> o.beta2) || comma != ',' || !in.eof()) {
    throw Diagnostic("--betas '" + text + "'", "expected two numbers B1,B2");
  }
}

}  // namespace

void addOptimizerFlags(CLI::App& app, OptimizerOptions& o, OptimizerFlags& f) {
  f.optimizerOpt = app.add_option("--optimizer", f.optimizer, "sgd, adam or adamw");
  f.lr = app.add_option("--lr", o.lr, "learning rate (torch.optim's default for adam/adamw: 1e-3)");
  f.momentum = app.add_option("--momentum", o.momentum, "sgd: momentum (0)");
  f.dampening = app.add_option("--dampening", o.dampening, "sgd: dampening (0)");
  f.nesterov = app.add_flag("--nesterov", o.nesterov, "sgd: Nesterov momentum");
  f.weightDecay = app.add_option("--weight-decay", o.weightDecay, "weight decay (0; adamw: 1e-2)");
  f.betasOpt = app.add_option("--betas", f.betas, "adam/adamw: B1,B2 (0.9,0.999)");
  f.eps = app.add_option("--eps", o.eps, "adam/adamw: epsilon (1e-8)");
  f.amsgrad = app.add_flag("--amsgrad", o.amsgrad, "adam/adamw: AMSGrad");
}

void finishOptimizerFlags(const OptimizerFlags& f, OptimizerOptions& o, bool required) {
  if (!*f.optimizerOpt) {
    if (required) throw Diagnostic("--optimizer", "required: sgd, adam or adamw");
  } else if (!parseOptimizerKind(f.optimizer, o.kind)) {
    throw Diagnostic("--optimizer", "unknown optimizer '" + f.optimizer + "' (sgd, adam, adamw)");
  }
  const bool isSgd = o.kind == OptimizerKind::Sgd;
  for (auto* flag : {f.momentum, f.dampening, f.nesterov}) {
    if (*flag && !isSgd) throw Diagnostic(flag->get_name(), "applies to --optimizer sgd only");
  }
  for (auto* flag : {f.betasOpt, f.eps, f.amsgrad}) {
    if (*flag && isSgd) throw Diagnostic(flag->get_name(), "applies to --optimizer adam and adamw only");
  }
  if (isSgd && !*f.lr) throw Diagnostic("--lr", "required for sgd, as torch.optim.SGD requires lr");
  if (o.kind == OptimizerKind::AdamW && !*f.weightDecay) o.weightDecay = 1e-2;
  if (*f.betasOpt) parseBetas(f.betas, o);
  validateOptimizer(o);
}

void addGradReduceFlag(CLI::App& app, GradReduce& reduce, const std::string& help) {
  app.add_option_function<std::string>(
         "--grad-reduce", [&reduce](const std::string& s) { reduce = s == "sum" ? GradReduce::Sum : GradReduce::Mean; },
         help)
      ->check(CLI::IsMember({"mean", "sum"}))
      ->default_str("mean");
}

void addPrecisionFlags(CLI::App& app, PrecisionFlags& flags) {
  app.add_option("--autocast", flags.autocast,
                 "DEVICE:DTYPE (cuda:bf16, cpu:bf16): torch.autocast's policy for that device type; "
                 "parameters, gradients and optimizer state stay fp32");
  app.add_option("--reduce-dtype", flags.reduceDtype,
                 "dtype of the gradient all-reduce (bf16, f16; default: the gradient's own, fp32)");
}

void finishPrecisionFlags(const PrecisionFlags& flags, PipelineOptions& options) {
  if (!flags.autocast.empty()) {
    const std::string flag = "--autocast '" + flags.autocast + "'";
    const size_t colon = flags.autocast.find(':');
    const std::string device = flags.autocast.substr(0, colon);
    const c10::ScalarType dtype = colon == std::string::npos
                                      ? c10::ScalarType::Undefined
                                      : parseDtype(flags.autocast.substr(colon + 1)).value_or(c10::ScalarType::Undefined);
    if ((device != "cuda" && device != "cpu") || dtype == c10::ScalarType::Undefined) {
      throw Diagnostic(flag, "expected DEVICE:DTYPE with DEVICE cuda or cpu (cuda:bf16)");
    }
    if (dtype == c10::ScalarType::Half) {
      throw Diagnostic(flag, "fp16 needs dynamic loss scaling (torch.cuda.amp.GradScaler), which spmd does not do; "
                             "use bf16");
    }
    if (dtype != c10::ScalarType::BFloat16) throw Diagnostic(flag, "autocast's lower precision type must be bf16");
    options.autocast = AutocastOptions{true, device, dtype};
  }
  if (!flags.reduceDtype.empty()) {
    const c10::ScalarType dtype = parseDtype(flags.reduceDtype).value_or(c10::ScalarType::Undefined);
    if (dtype != c10::ScalarType::Float && dtype != c10::ScalarType::BFloat16 && dtype != c10::ScalarType::Half) {
      throw Diagnostic("--reduce-dtype '" + flags.reduceDtype + "'", "expected f32, bf16 or f16");
    }
    options.reduceDtype = dtype == c10::ScalarType::Float ? c10::ScalarType::Undefined : dtype;
  }
}

void addTrainingFlags(CLI::App& app, TrainingFlags& flags) {
  TrainingConfig& c = flags.config;
  LrSchedule& s = c.schedule;
  app.add_option("--lr-schedule", flags.schedule,
                 "constant, linear, cosine (nanoGPT's) or step: the learning rate per step, after --warmup-steps")
      ->check(CLI::IsMember({"constant", "linear", "cosine", "step"}));
  app.add_option("--warmup-steps", s.warmupSteps, "steps of linear warmup: lr * (it + 1) / (W + 1) (0)");
  flags.decaySteps = app.add_option("--decay-steps", s.decaySteps, "linear/cosine: the step where the rate reaches --min-lr");
  flags.minLr = app.add_option("--min-lr", s.minLr, "linear/cosine: the rate after --decay-steps (0)");
  flags.stepSize = app.add_option("--step-size", s.stepSize, "step: multiply the rate by --gamma every K steps");
  flags.gamma = app.add_option("--gamma", s.gamma, "step: the factor (0.1)");
  flags.clip = app.add_option("--clip-grad-norm", c.clipMaxNorm,
                 "clip the reduced gradients to this global norm (torch.nn.utils.clip_grad_norm_)");
  flags.clipType = app.add_option("--clip-grad-norm-type", flags.normType, "2 or inf (2)")->check(CLI::IsMember({"2", "2.0", "inf"}));
  app.add_option("--micro-batches", c.microBatches,
                 "N: forward and backward on N micro-batches of the --input shapes, gradients reduced once (1)");
}

void finishTrainingFlags(const TrainingFlags& flags, PipelineOptions& options) {
  TrainingConfig c = flags.config;
  LrSchedule& s = c.schedule;
  if (!flags.schedule.empty()) parseLrScheduleKind(flags.schedule, s.kind);
  const bool decays = s.kind == LrScheduleKind::Linear || s.kind == LrScheduleKind::Cosine;
  for (CLI::Option* flag : {flags.decaySteps, flags.minLr}) {
    if (*flag && !decays) throw Diagnostic(flag->get_name(), "applies to --lr-schedule linear and cosine only");
  }
  if (decays && !*flags.decaySteps) throw Diagnostic("--decay-steps", "required for --lr-schedule " + flags.schedule);
  for (CLI::Option* flag : {flags.stepSize, flags.gamma}) {
    if (*flag && s.kind != LrScheduleKind::Step) throw Diagnostic(flag->get_name(), "applies to --lr-schedule step only");
  }
  if (s.kind == LrScheduleKind::Step && !*flags.stepSize) throw Diagnostic("--step-size", "required for --lr-schedule step");
  c.clipNormType = flags.normType == "inf" ? kInfNorm : 2.0;
  if (*flags.clip && !(c.clipMaxNorm > 0.0)) throw Diagnostic("--clip-grad-norm", "must be a finite number > 0");
  if (*flags.clipType && !*flags.clip) throw Diagnostic("--clip-grad-norm-type", "applies with --clip-grad-norm only");
  validateTraining(c);
  s.lr = options.optimizer.lr;
  c.scheduled = s.kind != LrScheduleKind::Constant || s.warmupSteps > 0;
  options.training = c;
}

// A finite number > 0: CLI11's PositiveNumber lets nan and inf through.
const CLI::Validator kFinitePositive(
    [](std::string& text) {
      double v = 0;
      return CLI::detail::lexical_cast(text, v) && std::isfinite(v) && v > 0 ? std::string()
                                                                               : std::string("must be a finite number > 0");
    },
    "FINITE > 0");

void addBucketFlags(CLI::App& app, BucketOptions& options) {
  app.add_option("--bucket-cap-mb", options.capMb, "bucket capacity in MiB")
      ->check(kFinitePositive)
      ->capture_default_str();
  app.add_option("--first-bucket-cap-mb", options.firstCapMb,
                 "capacity of the first bucket filled (the last in forward order)")
      ->check(kFinitePositive)
      ->capture_default_str();
  app.add_option("--ignore-param", options.ignored, "a parameter DDP ignores: never bucketed, never synced");
  app.add_option("--world-size", options.worldSize,
                 "the ranks spmd-run will run the step on (recorded in the graph; spmd-run refuses another)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  CLI::Option* shard = app.add_option_function<std::string>(
      "--shard",
      [&options](const std::string& mode) {
        if (!parseShardMode(mode, options.shard)) {
          throw CLI::ValidationError("--shard", "expected none, optimizer, gradients or parameters");
        }
      },
      "none (DDP), optimizer (ZeRO-1: optimizer state sharded), gradients (ZeRO-2: gradients too) or parameters "
      "(ZeRO-3, FSDP: parameters too, gathered for the forward and again for the backward); needs --world-size");
  shard->type_name("MODE")->default_str("none");
}

void addUnrollFlags(CLI::App& app, UnrollOptions& options) {
  app.add_option("--iters", options.iters, "iterations the artifact runs (spmd-run's default --steps)")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  app.add_flag_callback("--no-move", [&options] { options.move = false; }, "move nothing across iterations");
}

void addLowerFlags(CLI::App& app, LowerOptions& options) {
  app.add_option("--device", options.device, "cpu or cuda: where spmd-run will run it")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("--cudagraphs", options.cudagraphs, "capture the repeating iteration into a CUDA graph (CUDA only)");
  app.add_flag_callback("--no-fuse", [&options] { options.fuse = false; },
                        "keep the optimizer's per-parameter ops (no _foreach calls)");
  app.add_flag_callback("--no-generated-kernels", [&options] { options.generateKernels = false; },
                        "CUDA: keep ATen's kernels (no generated kernels: cast-before-view, dropout-mask-in-kernel, fuse-rows, fuse-pointwise, stack-to-kernel, cross-entropy-to-kernel, layer-norm-to-kernel, column-sum-to-kernel; fp32 attention: efficient, not gemm)");
  app.add_option("--attention-kernel", options.attentionKernel,
                 "CUDA attention kernel: auto (bf16/fp16: cudnn up to head size 128, flash up to 256; fp32: gemm up "
                 "to 2048 keys; a mask other than the causal one: efficient; dropout: flash for bf16/fp16; else "
                 "efficient), efficient, flash, cudnn, gemm (fp32: batched GEMMs and a generated softmax), or math "
                 "(unfused); one that cannot take an attention gives way to auto's choice")
      ->check(CLI::IsMember({"auto", "efficient", "flash", "cudnn", "gemm", "math"}))
      ->capture_default_str();
  app.add_option("--memory-format", options.memoryFormat,
                 "CUDA: the memory order of 2-D convolutions' tensors: auto (channels-last for a graph of 2 or more "
                 "2-D convolutions), channels-last, or contiguous")
      ->check(CLI::IsMember({"auto", "channels-last", "contiguous"}))
      ->capture_default_str();
}

void addInputSpecFlag(CLI::App& app, std::vector<std::string>& specs) {
  app.add_option("--input", specs, "NAME:DTYPE[d0,d1,...] per-rank shape of a forward argument (TorchScript)");
}

void addDebugFlags(CLI::App& app, DebugOptions& debug) {
  debug.log = &std::cerr;
  app.add_flag("--print-ir-after-all", debug.printIrAfterAll, "print the listing after every pass on stderr");
  CLI::Validator isPass(
      [](std::string& name) -> std::string {
        if (const PassInfo* pass = findPass(name)) {
          name = pass->name;  // a former name: the listing after the pass of today's
          return "";
        }
        return "unknown pass '" + name + "' (see --list-passes)";
      },
      "");
  app.add_option("--print-ir-after", debug.printIrAfter, "print the listing after PASS on stderr (repeatable)")
      ->type_name("PASS")
      ->allow_extra_args(false)  // one PASS per flag: `--print-ir-after bucket IN` keeps IN positional
      ->transform(isPass);
  app.add_flag_callback(
      "--time-passes",
      [&debug] {
        debug.timePasses = true;
        enablePhaseTimes();  // from here: reading the input is timed too
      },
      "print the time each phase took on stderr: reading, verifying, each pass, writing");
  app.add_flag("--pass-statistics", debug.passStatistics,
               "print what each pass counted (rewrites, fusions, notes' numbers) on stderr after the passes");
  app.add_option("--dump-dir", debug.dumpDir, "write NNNN.after_<pass>.txt for every pass into DIR");
}

void addStageFlags(CLI::App& app, PipelineOptions& options, StageFlags& flags) {
  addOptimizerFlags(app, options.optimizer, flags.optimizer);
  addGradReduceFlag(app, options.gradReduce, "mean (DDP) or sum (_spmd) over ranks");
  addPrecisionFlags(app, flags.precision);
  addTrainingFlags(app, flags.training);
  addBucketFlags(app, options.buckets);
  addUnrollFlags(app, options.unroll);
  addLowerFlags(app, options.lower);
}

void finishStageFlags(const StageFlags& flags, PipelineOptions& options, bool optimizerRequired) {
  finishOptimizerFlags(flags.optimizer, options.optimizer, optimizerRequired);
  finishPrecisionFlags(flags.precision, options);
  finishTrainingFlags(flags.training, options);
}

void addListPassesFlag(CLI::App& app) {
  // A callback runs before CLI11 checks for required flags.
  app.add_flag_callback(
      "--list-passes",
      [] {
        std::cout << listPasses();
        throw CLI::Success();
      },
      "list the passes and exit");
}

}  // namespace spmd

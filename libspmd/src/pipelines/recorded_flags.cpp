#include "spmd/pipelines/recorded_flags.h"

#include "spmd/ir/graph.h"
#include "spmd/ops/dtype.h"
#include "spmd/support/text.h"

#include <algorithm>
#include <set>

namespace spmd {
namespace {

using Words = std::vector<std::vector<std::string>>;

// What a flag takes, as a user types it: "0.001", "1e-08", "2".
std::string numberText(double v) {
  std::string s = floatText(v);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}

void optimizerWords(const OptimizerOptions& o, Words& out) {
  out.push_back({"--optimizer", optimizerName(o.kind)});
  out.push_back({"--lr", numberText(o.lr)});
  if (o.kind == OptimizerKind::Sgd) {
    out.push_back({"--momentum", numberText(o.momentum)});
    out.push_back({"--dampening", numberText(o.dampening)});
    if (o.nesterov) out.push_back({"--nesterov"});
  } else {
    out.push_back({"--betas", numberText(o.beta1) + "," + numberText(o.beta2)});
    out.push_back({"--eps", numberText(o.eps)});
    if (o.amsgrad) out.push_back({"--amsgrad"});
  }
  out.push_back({"--weight-decay", numberText(o.weightDecay)});
}

void trainingWords(const TrainingConfig& c, Words& out) {
  const LrSchedule& s = c.schedule;
  if (s.kind != LrScheduleKind::Constant || s.warmupSteps > 0) {
    out.push_back({"--lr-schedule", lrScheduleName(s.kind)});
    if (s.warmupSteps > 0) out.push_back({"--warmup-steps", std::to_string(s.warmupSteps)});
    if (s.kind == LrScheduleKind::Linear || s.kind == LrScheduleKind::Cosine) {
      out.push_back({"--decay-steps", std::to_string(s.decaySteps)});
      out.push_back({"--min-lr", numberText(s.minLr)});
    }
    if (s.kind == LrScheduleKind::Step) {
      out.push_back({"--step-size", std::to_string(s.stepSize)});
      out.push_back({"--gamma", numberText(s.gamma)});
    }
  }
  if (c.clips()) {
    out.push_back({"--clip-grad-norm", numberText(c.clipMaxNorm)});
    out.push_back({"--clip-grad-norm-type", numberText(c.clipNormType)});
  }
  if (c.microBatches != 1) out.push_back({"--micro-batches", std::to_string(c.microBatches)});
}

void precisionWords(const PipelineOptions& o, Words& out) {
  if (o.autocast.enabled) out.push_back({"--autocast", o.autocast.device + ":" + dtypeShortName(o.autocast.dtype)});
}

void expandWords(const PipelineOptions& o, bool evalStep, Words& out) {
  if (evalStep) {
    out.push_back({"--eval-step"});
    precisionWords(o, out);
    return;
  }
  optimizerWords(o.optimizer, out);
  out.push_back({"--grad-reduce", o.gradReduce == GradReduce::Mean ? "mean" : "sum"});
  precisionWords(o, out);
  if (o.reduceDtype != c10::ScalarType::Undefined) out.push_back({"--reduce-dtype", dtypeShortName(o.reduceDtype)});
  trainingWords(o.training, out);
}

// spmd-split's --grad-reduce matters only for a dump without gradient sync,
// which spmd-expand never writes: spmd-expand's record of it stands.
void splitWords(const BucketOptions& b, Words& out) {
  out.push_back({"--bucket-cap-mb", numberText(b.capMb)});
  out.push_back({"--first-bucket-cap-mb", numberText(b.firstCapMb)});
  for (const std::string& name : b.ignored) out.push_back({"--ignore-param", name});
  if (b.worldSize > 0) out.push_back({"--world-size", std::to_string(b.worldSize)});
  if (b.shard != ShardMode::None) out.push_back({"--shard", shardModeName(b.shard)});
}

void unrollWords(const UnrollOptions& u, Words& out) {
  out.push_back({"--iters", std::to_string(u.iters)});
  if (!u.move) out.push_back({"--no-move"});
}

void lowerWords(const LowerOptions& l, Words& out) {
  out.push_back({"--device", l.device});
  if (l.cudagraphs) out.push_back({"--cudagraphs"});
  if (!l.fuse) out.push_back({"--no-fuse"});
  if (!l.generateKernels) out.push_back({"--no-generated-kernels"});
  out.push_back({"--attention-kernel", l.attentionKernel});
  if (l.memoryFormat != "auto") out.push_back({"--memory-format", l.memoryFormat});
}

}  // namespace

std::vector<std::vector<std::string>> stageFlagWords(const PipelineOptions& options, Stage stage, bool evalStep) {
  Words out;
  switch (stage) {
    case Stage::Expand: expandWords(options, evalStep, out); break;
    case Stage::Split: splitWords(options.buckets, out); break;
    case Stage::Unroll: unrollWords(options.unroll, out); break;
    case Stage::Lower: lowerWords(options.lower, out); break;
  }
  return out;
}

void recordStageFlags(Graph& g, const PipelineOptions& options, Stage stage, bool evalStep) {
  const Words added = stageFlagWords(options, stage, evalStep);
  std::set<std::string> names;
  for (const auto& words : added) names.insert(words[0]);
  Words flags = g.flags();
  flags.erase(std::remove_if(flags.begin(), flags.end(), [&](const auto& words) { return names.count(words[0]) > 0; }),
              flags.end());
  flags.insert(flags.end(), added.begin(), added.end());
  g.setFlags(std::move(flags));
}

}  // namespace spmd

#include "spmd/ir/training.h"

#include "spmd/support/text.h"
#include "spmd/support/diagnostic.h"

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <vector>

namespace spmd {

const char* lrScheduleName(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::Constant: return "constant";
    case LrScheduleKind::Linear: return "linear";
    case LrScheduleKind::Cosine: return "cosine";
    case LrScheduleKind::Step: return "step";
  }
  return "?";
}

bool parseLrScheduleKind(const std::string& name, LrScheduleKind& kind) {
  for (LrScheduleKind k : {LrScheduleKind::Constant, LrScheduleKind::Linear, LrScheduleKind::Cosine, LrScheduleKind::Step}) {
    if (name == lrScheduleName(k)) {
      kind = k;
      return true;
    }
  }
  return false;
}

const char* shardModeName(ShardMode mode) {
  switch (mode) {
    case ShardMode::None: return "none";
    case ShardMode::Optimizer: return "optimizer";
    case ShardMode::Gradients: return "gradients";
    case ShardMode::Parameters: return "parameters";
  }
  return "?";
}

bool parseShardMode(const std::string& name, ShardMode& mode) {
  for (ShardMode m : {ShardMode::None, ShardMode::Optimizer, ShardMode::Gradients, ShardMode::Parameters}) {
    if (name == shardModeName(m)) {
      mode = m;
      return true;
    }
  }
  return false;
}

double learningRateAt(const LrSchedule& s, int64_t it) {
  const int64_t w = s.warmupSteps;
  if (it < w) return s.lr * static_cast<double>(it + 1) / static_cast<double>(w + 1);
  switch (s.kind) {
    case LrScheduleKind::Constant: return s.lr;
    case LrScheduleKind::Linear: {
      if (it > s.decaySteps) return s.minLr;
      const double ratio = static_cast<double>(it - w) / static_cast<double>(s.decaySteps - w);
      return s.lr + ratio * (s.minLr - s.lr);
    }
    case LrScheduleKind::Cosine: {
      if (it > s.decaySteps) return s.minLr;
      const double ratio = static_cast<double>(it - w) / static_cast<double>(s.decaySteps - w);
      const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
      return s.minLr + coeff * (s.lr - s.minLr);
    }
    case LrScheduleKind::Step: {
      // StepLR multiplies the previous rate by gamma at each boundary.
      double lr = s.lr;
      for (int64_t k = (it - w) / s.stepSize; k > 0; --k) lr *= s.gamma;
      return lr;
    }
  }
  return s.lr;
}

void validateTraining(const TrainingConfig& c) {
  const LrSchedule& s = c.schedule;
  if (s.warmupSteps < 0) throw Diagnostic("--warmup-steps", "must not be negative");
  const bool decays = s.kind == LrScheduleKind::Linear || s.kind == LrScheduleKind::Cosine;
  if (decays && s.decaySteps <= s.warmupSteps) {
    throw Diagnostic("--decay-steps", std::string(lrScheduleName(s.kind)) + " decay must end after the warmup: need " +
                                          std::to_string(s.decaySteps) + " > --warmup-steps " +
                                          std::to_string(s.warmupSteps));
  }
  if (!std::isfinite(s.minLr) || s.minLr < 0.0) throw Diagnostic("--min-lr", "must be a finite number >= 0");
  if (s.kind == LrScheduleKind::Step && s.stepSize < 1) throw Diagnostic("--step-size", "must be at least 1 for --lr-schedule step");
  if (!std::isfinite(s.gamma) || s.gamma <= 0.0) throw Diagnostic("--gamma", "must be a finite number > 0");
  if (c.clipMaxNorm < 0.0 || !std::isfinite(c.clipMaxNorm)) {
    throw Diagnostic("--clip-grad-norm", "must be a finite number > 0");
  }
  if (c.clipNormType != 2.0 && c.clipNormType != kInfNorm) throw Diagnostic("--clip-grad-norm-type", "must be 2 or inf");
  if (c.microBatches < 1) throw Diagnostic("--micro-batches", "must be at least 1");
  if (c.worldSize < 0) throw Diagnostic("--world-size", "must be at least 1");
  if (c.shard != ShardMode::None && c.worldSize < 1) throw Diagnostic("--shard", "needs --world-size");
}

namespace {

std::string normTypeText(double t) { return t == kInfNorm ? "inf" : floatText(t); }

}  // namespace

std::string trainingText(const TrainingConfig& c) {
  std::vector<std::string> parts;
  const LrSchedule& s = c.schedule;
  if (c.scheduled) {
    parts.push_back(std::string("lr-schedule=") + lrScheduleName(s.kind));
    parts.push_back("lr=" + floatText(s.lr));
    if (s.warmupSteps) parts.push_back("warmup=" + std::to_string(s.warmupSteps));
    if (s.kind == LrScheduleKind::Linear || s.kind == LrScheduleKind::Cosine) {
      parts.push_back("decay=" + std::to_string(s.decaySteps));
      parts.push_back("min-lr=" + floatText(s.minLr));
    }
    if (s.kind == LrScheduleKind::Step) {
      parts.push_back("step-size=" + std::to_string(s.stepSize));
      parts.push_back("gamma=" + floatText(s.gamma));
    }
  }
  if (c.clips()) {
    parts.push_back("clip-grad-norm=" + floatText(c.clipMaxNorm));
    parts.push_back("norm-type=" + normTypeText(c.clipNormType));
  }
  if (c.microBatches != 1) parts.push_back("micro-batches=" + std::to_string(c.microBatches));
  if (c.worldSize) parts.push_back("world-size=" + std::to_string(c.worldSize));
  if (c.shard != ShardMode::None) parts.push_back(std::string("shard=") + shardModeName(c.shard));
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? " " : "") + parts[i];
  return text;
}

namespace {

bool wholeDouble(const std::string& s, double& out) {
  if (s == "inf") {
    out = kInfNorm;
    return true;
  }
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

bool wholeInt(const std::string& s, int64_t& out) {
  char* end = nullptr;
  out = std::strtoll(s.c_str(), &end, 10);
  return !s.empty() && end == s.c_str() + s.size();
}

}  // namespace

std::string parseTrainingText(const std::string& text, TrainingConfig& c) {
  c = TrainingConfig{};
  std::istringstream words(text);
  std::string word;
  while (words >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) return "expected KEY=VALUE, got '" + word.substr(0, 40) + "'";
    const std::string key = word.substr(0, eq), value = word.substr(eq + 1);
    double f = 0;
    int64_t i = 0;
    bool ok = true;
    if (key == "lr-schedule") {
      ok = parseLrScheduleKind(value, c.schedule.kind);
      c.scheduled = true;
    } else if (key == "lr") {
      ok = wholeDouble(value, c.schedule.lr);
    } else if (key == "warmup") {
      ok = wholeInt(value, c.schedule.warmupSteps);
    } else if (key == "decay") {
      ok = wholeInt(value, c.schedule.decaySteps);
    } else if (key == "min-lr") {
      ok = wholeDouble(value, c.schedule.minLr);
    } else if (key == "step-size") {
      ok = wholeInt(value, c.schedule.stepSize);
    } else if (key == "gamma") {
      ok = wholeDouble(value, c.schedule.gamma);
    } else if (key == "clip-grad-norm") {
      ok = wholeDouble(value, f) && f > 0;
      c.clipMaxNorm = f;
    } else if (key == "norm-type") {
      ok = wholeDouble(value, c.clipNormType);
    } else if (key == "micro-batches") {
      ok = wholeInt(value, i);
      c.microBatches = i;
    } else if (key == "world-size") {
      ok = wholeInt(value, c.worldSize) && c.worldSize >= 1;
    } else if (key == "shard") {
      ok = parseShardMode(value, c.shard);
    } else {
      return "unknown key '" + key.substr(0, 40) + "'";
    }
    if (!ok) return "bad value for " + key + ": '" + value.substr(0, 40) + "'";
  }
  try {
    validateTraining(c);
  } catch (const Diagnostic& d) {
    return d.where().substr(2) + " " + d.message();
  }
  return "";
}

}  // namespace spmd

#include "run_report.h"

#include "spmd/io/load.h"
#include "spmd/io/torch_save.h"
#include "spmd/ir/printer.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace spmd {
namespace {

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[static_cast<size_t>(q * (v.size() - 1) + 0.5)];
}

}  // namespace

void requireWritableDirectory(const std::string& path, const std::string& flag) {
  if (path.empty() || path == "-") return;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw Diagnostic(flag + " " + path, "is a directory; name a file");
  }
  // access() is not enough: root passes it for /proc, and a regular file
  // passes it where a directory was meant. Making a file there is the test.
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const long nameMax = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  if (nameMax > 0 && name.size() > static_cast<size_t>(nameMax)) {
    throw Diagnostic(flag + " " + path.substr(0, 60) + "...", "a file name of " + std::to_string(name.size()) +
                                                                 " bytes, longer than this file system's " +
                                                                 std::to_string(nameMax));
  }
  std::string probe = dir + "/.spmd-probe-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) throw Diagnostic(flag + " " + path, "cannot write to " + dir + ": " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

void saveStateDict(const Graph& g, const TensorMap& params, const TensorMap& state, const std::string& path) {
  std::vector<std::pair<std::string, at::Tensor>> entries;
  for (InputKind kind : {InputKind::Parameter, InputKind::Buffer}) {
    for (const auto& in : g.inputs()) {
      if (in.kind != kind) continue;
      const std::string& name = g.value(in.value).name;
      const at::Tensor& t = kind == InputKind::Parameter ? params.at(name) : state.at(name);
      entries.emplace_back(name, t.detach().to(at::kCPU).contiguous());
    }
  }
  writeOutput(path, saveTorchSave(entries));
}

void saveParameters(const Graph& g, const TensorMap& state, const std::string& path) {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& in : g.inputs()) {
    if (in.kind == InputKind::Parameter) {
      const std::string& name = g.value(in.value).name;
      params.emplace_back(name, state.at(name).detach().to(at::kCPU).contiguous());
    }
  }
  // Not torch::pickle_save: torch.load(weights_only=True) rejects the
  // torch.jit._pickle globals in its output.
  writeOutput(path, saveTorchSave(params));
}

namespace {

// A FIFO is opened without waiting for a reader (the open would block until
// one came): one that nobody reads is refused; with a reader, lines stream.
std::FILE* openFifoForAppending(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENXIO) throw Diagnostic("--metrics " + path, "cannot write: a FIFO that nobody reads");
  if (fd < 0) return nullptr;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::FILE* file = ::fdopen(fd, "a");
  if (!file) ::close(fd);
  return file;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, int64_t samplesPerStep) : path_(path), samplesPerStep_(samplesPerStep) {
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  const bool fifo = exists && S_ISFIFO(st.st_mode);
  created_ = !exists;
  file_ = fifo ? openFifoForAppending(path) : std::fopen(path.c_str(), "a");
  if (!file_) throw Diagnostic("--metrics " + path, std::string("cannot open for appending: ") + std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

namespace {

std::string jsonNumber(double v) { return std::isfinite(v) ? floatText(v) : "null"; }

}  // namespace

void MetricsLog::write(int step, const StepReport& r, int64_t peakBytes) {
  std::string line = "{\"step\": " + std::to_string(step) + ", \"loss\": " + (r.loss ? jsonNumber(*r.loss) : "null");
  if (r.lr) line += ", \"lr\": " + jsonNumber(*r.lr);
  if (r.gradNorm) line += ", \"grad_norm\": " + jsonNumber(*r.gradNorm);
  if (r.valLoss) line += ", \"val_loss\": " + jsonNumber(*r.valLoss);
  char ms[64];
  std::snprintf(ms, sizeof ms, ", \"ms\": %.4f", r.ms);
  line += ms;
  if (samplesPerStep_ > 0 && r.ms > 0) {
    char rate[64];
    std::snprintf(rate, sizeof rate, ", \"samples_per_s\": %.2f", samplesPerStep_ * 1000.0 / r.ms);
    line += rate;
  }
  if (peakBytes > 0) line += ", \"peak_bytes\": " + std::to_string(peakBytes);
  line += "}\n";
  if (std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0) {
    const std::string why = std::strerror(errno);
    if (created_ && !wroteLine_) {  // no empty or partial log left behind
      std::fclose(file_);
      file_ = nullptr;
      ::unlink(path_.c_str());
    }
    throw Diagnostic("--metrics " + path_, "cannot write: " + why);
  }
  wroteLine_ = true;
}

void RunRecord::addStep(const StepReport& step, bool timed) {
  if (step.loss) losses_.push_back(*step.loss);
  if (step.lr) lrs_.push_back(*step.lr);
  if (step.gradNorm) gradNorms_.push_back(*step.gradNorm);
  if (step.valLoss) valLosses_.emplace_back(step.step, *step.valLoss);
  if (timed) ms_.push_back(step.ms);
}

void RunRecord::writeJson(std::ostream& out) const {
  const double median = percentile(ms_, 0.5), lo = *std::min_element(ms_.begin(), ms_.end()),
               hi = *std::max_element(ms_.begin(), ms_.end());
  std::ostringstream j;
  j << "{\"ranks\": " << ranks_ << ", \"device\": \"" << device_ << "\", \"steps\": " << steps_
    << ", \"timed_steps\": " << ms_.size() << ", \"peak_bytes\": " << peakBytes_
    << ", \"kernels_compiled_at_launch\": " << kernelsCompiled_ << ", \"losses\": [";
  auto list = [&j](const char* key, const std::vector<double>& values) {
    if (values.empty()) return;
    j << "], \"" << key << "\": [";
    for (size_t i = 0; i < values.size(); ++i) j << (i ? ", " : "") << floatText(values[i]);
  };
  for (size_t i = 0; i < losses_.size(); ++i) j << (i ? ", " : "") << floatText(losses_[i]);
  list("lrs", lrs_);
  list("grad_norms", gradNorms_);
  if (!valLosses_.empty()) {  // [[step, loss], ...]: the steps after which the run evaluated
    j << "], \"val_losses\": [";
    for (size_t i = 0; i < valLosses_.size(); ++i) {
      j << (i ? ", " : "") << "[" << valLosses_[i].first << ", " << floatText(valLosses_[i].second) << "]";
    }
  }
  char summary[256];
  std::snprintf(summary, sizeof summary,
                "], \"ms_per_step\": {\"median\": %.4f, \"min\": %.4f, \"max\": %.4f}, \"steps_per_s\": %.3f}\n", median,
                lo, hi, median > 0 ? 1000.0 / median : 0.0);
  out << j.str() << summary << std::flush;
}

void RunRecord::writeSummary(std::ostream& out, bool finalLoss) const {
  const double median = percentile(ms_, 0.5), lo = *std::min_element(ms_.begin(), ms_.end()),
               hi = *std::max_element(ms_.begin(), ms_.end());
  if (finalLoss && !losses_.empty()) out << "final loss " << floatText(losses_.back()) << "\n";
  char summary[256];
  std::snprintf(summary, sizeof summary,
                "%d steps on %d rank%s (%s): median %.3f ms, min %.3f ms, max %.3f ms per step, %.1f steps/s\n", steps_,
                ranks_, ranks_ == 1 ? "" : "s", device_.c_str(), median, lo, hi, median > 0 ? 1000.0 / median : 0.0);
  out << summary;
  if (peakBytes_ > 0) {
    out << "peak device memory " << floatText(std::round(peakBytes_ / 1048576.0 * 10) / 10) << " MiB on rank 0\n";
  }
  out << std::flush;
}

}  // namespace spmd

#include "step_trace.h"

#include "spmd/io/load.h"
#include "spmd/support/diagnostic.h"

#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <set>

namespace spmd {
namespace {

namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::set<ActivityType> activitiesOn(const RunDevice& device) {
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device.isCuda()) activities.insert(ActivityType::CUDA);
  return activities;
}

double startUs(const kineto::KinetoEvent& event) { return static_cast<double>(event.startNs()) / 1e3; }

// One Chrome trace "complete" event. CPU events (ATen ops, CUDA runtime
// calls) go on their thread; device events (kernels, copies) on their stream.
// An op's "correlation" and a kernel's "launched_by" (the correlation of
// the op that launched it) tie each kernel to its op, as torch.profiler
// ties them (bench/trace_kernels.py --by-op).
nlohmann::ordered_json traceEvent(const kineto::KinetoEvent& event, double originUs) {
  const bool onCpu = event.deviceType() == c10::DeviceType::CPU;
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  if (onCpu && event.correlationId() != 0) args["correlation"] = event.correlationId();
  if (!onCpu && event.linkedCorrelationId() != 0) args["launched_by"] = event.linkedCorrelationId();
  return {{"name", event.name()},
          {"cat", onCpu ? "cpu" : "gpu"},
          {"ph", "X"},
          {"ts", startUs(event) - originUs},
          {"dur", static_cast<double>(event.durationNs()) / 1e3},
          {"pid", onCpu ? std::string("cpu") : c10::DeviceTypeName(event.deviceType(), true) + ":" +
                                                   std::to_string(static_cast<int>(event.deviceIndex()))},
          {"tid", onCpu ? static_cast<int64_t>(event.startThreadId()) : event.deviceResourceId()},
          {"args", args}};
}

// Kineto's own save() exists only in builds with Kineto (not Debian's
// LibTorch); the events are there in every build, so the file is ours.
std::string chromeTrace(const std::vector<kineto::KinetoEvent>& events, int steps, const std::string& device) {
  std::vector<const kineto::KinetoEvent*> sorted;
  for (const auto& event : events) sorted.push_back(&event);
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) {
    return a->startNs() < b->startNs();
  });
  const double origin = sorted.empty() ? 0.0 : startUs(*sorted.front());
  // One event a line: a trace stays readable and diffable as text.
  nlohmann::ordered_json header = {{"steps", steps}, {"device", device}};
  std::string text = "{\"spmd\": " + header.dump() + ", \"displayTimeUnit\": \"ms\", \"traceEvents\": [";
  for (size_t i = 0; i < sorted.size(); ++i) {
    text += (i ? ",\n" : "\n") + traceEvent(*sorted[i], origin).dump();
  }
  return text + "\n]}\n";
}

}  // namespace

StepTrace::~StepTrace() {
  if (!recording_) return;
  try {
    kineto::disableProfiler();
  } catch (...) {  // the run's own error is the one to report
  }
}

void StepTrace::beforeStep(bool timed) {
  if (!timed) return;
  ++steps_;
  if (recording_) return;
  const ProfilerConfig config(ProfilerState::KINETO);
  const auto activities = activitiesOn(device_);
  kineto::prepareProfiler(config, activities);
  kineto::enableProfiler(config, activities);
  recording_ = true;
}

void StepTrace::write() {
  if (!recording_) return;
  device_.synchronize();
  recording_ = false;
  const auto result = kineto::disableProfiler();
  writeOutput(path_, chromeTrace(result->events(), steps_, device_.name()));
}

}  // namespace spmd

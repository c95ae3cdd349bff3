#include "spmd/ir/rewrite.h"

#include "spmd/ops/dispatch.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace spmd {

RewritePattern::RewritePattern(std::string name, std::initializer_list<const char*> roots) : name_(std::move(name)) {
  for (const char* root : roots) roots_.push_back(OpName::known(root));
}

std::string noteWhere(const Node& node) {
  return node.qualifiedName() + (node.meta.source.empty() ? "" : " at " + node.meta.source);
}

size_t argumentIndex(OpName op, std::string_view name) {
  static std::map<std::pair<uint32_t, std::string>, size_t> known;  // patterns ask the same few, often
  std::pair<uint32_t, std::string> key{op.id(), std::string(name)};
  if (auto it = known.find(key); it != known.end()) return it->second;
  const std::string& qualified = op.str();
  const size_t dot = qualified.find('.', qualified.find("::"));
  const std::optional<c10::OperatorHandle> handle =
      findOperator(qualified.substr(0, dot), dot == std::string::npos ? "" : qualified.substr(dot + 1));
  if (!handle) throw std::logic_error("no operator " + qualified);
  const auto& arguments = handle->schema().arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].name() == name) return known[key] = i;
  }
  throw std::logic_error(qualified + " has no argument '" + std::string(name) + "'");
}

const Arg& argument(const Node& n, std::string_view name) {
  const size_t i = argumentIndex(n.name(), name);
  if (i >= n.args.size()) {
    throw std::logic_error(n.qualifiedName() + " has " + std::to_string(n.args.size()) + " arguments, not '" +
                           std::string(name) + "'");
  }
  return n.args[i];
}

const Node* producerOf(const Graph& g, const Node& n, size_t index, OpName op) {
  if (index >= n.args.size() || n.args[index].kind != Arg::Kind::Value) return nullptr;
  const Node* p = g.producer(n.args[index].value);
  return p && p->is(op) ? p : nullptr;
}

int RewriteCounts::total() const { return std::accumulate(applied.begin(), applied.end(), 0); }

namespace {

// One sweep's nodes: the graph's in program order, then those rewrites add;
// a node erased before its turn is skipped, and its failures forgotten.
class Sweep final : public GraphListener {
 public:
  explicit Sweep(Graph& g) : g_(g), previous_(g.setListener(this)) {
    for (const Node& n : g.nodes()) queue_.push_back(&n);
  }
  ~Sweep() override { g_.setListener(previous_); }
  Sweep(const Sweep&) = delete;
  Sweep& operator=(const Sweep&) = delete;

  void nodeInserted(const Node& n) override {
    erased_.erase(&n);
    queue_.push_back(&n);
    if (previous_) previous_->nodeInserted(n);
  }
  void nodeErased(const Node& n) override {
    erased_.insert(&n);
    failures_.erase(&n);
    if (previous_) previous_->nodeErased(n);
  }

  const Node* next() {
    while (at_ < queue_.size()) {
      const Node* n = queue_[at_++];
      if (!erased_.count(n)) return n;
    }
    return nullptr;
  }
  void fail(const Node& n, const RewritePattern& p, std::string why) {
    failures_[&n].push_back(PatternFailure{&n, &p, std::move(why)});
  }
  // The failures of nodes still in the graph, in program order.
  std::vector<PatternFailure> failures() const {
    std::vector<const Node*> nodes;
    for (const auto& [n, list] : failures_) nodes.push_back(n);
    std::sort(nodes.begin(), nodes.end(), [&](const Node* a, const Node* b) { return g_.indexOf(*a) < g_.indexOf(*b); });
    std::vector<PatternFailure> out;
    for (const Node* n : nodes) {
      const auto& list = failures_.at(n);
      out.insert(out.end(), list.begin(), list.end());
    }
    return out;
  }

 private:
  Graph& g_;
  GraphListener* previous_;
  std::vector<const Node*> queue_;
  size_t at_ = 0;
  std::unordered_set<const Node*> erased_;
  std::unordered_map<const Node*, std::vector<PatternFailure>> failures_;
};

constexpr int kMaxSweeps = 64;

}  // namespace

RewriteCounts applyPatternsGreedily(Graph& g, const std::vector<RewritePattern*>& patterns,
                                    const std::function<void(const PatternFailure&)>& onFailure) {
  std::map<OpName, std::vector<size_t>> byRoot;  // op -> indices into patterns
  for (size_t i = 0; i < patterns.size(); ++i) {
    for (OpName root : patterns[i]->roots()) byRoot[root].push_back(i);
  }
  RewriteCounts counts;
  counts.applied.assign(patterns.size(), 0);
  for (int sweepNumber = 0; sweepNumber < kMaxSweeps; ++sweepNumber) {
    Sweep sweep(g);
    bool changed = false;
    while (const Node* n = sweep.next()) {
      auto it = byRoot.find(n->name());
      if (it == byRoot.end()) continue;
      for (size_t i : it->second) {
        MatchResult r = patterns[i]->matchAndRewrite(g, *n);
        if (r) {
          ++counts.applied[i];
          changed = true;
          break;
        }
        if (!r.reason().empty()) sweep.fail(*n, *patterns[i], r.reason());
      }
    }
    if (!changed) {
      if (onFailure) {
        for (const PatternFailure& f : sweep.failures()) onFailure(f);
      }
      return counts;
    }
  }
  throw std::logic_error("applyPatternsGreedily: the patterns still apply after " + std::to_string(kMaxSweeps) + " sweeps");
}

RewriteCounts applyPatternsNotingFailures(Graph& g, const std::vector<RewritePattern*>& patterns,
                                          DiagnosticEngine& diagnostics, const std::string& failurePrefix) {
  // One note per place and reason, with how many nodes it is about: a
  // model's layers repeat one source line many times.
  std::vector<std::pair<std::string, std::string>> order;
  std::map<std::pair<std::string, std::string>, int> times;
  const RewriteCounts counts = applyPatternsGreedily(g, patterns, [&](const PatternFailure& f) {
    const auto key = std::make_pair(noteWhere(*f.node), failurePrefix + f.why);
    if (times[key]++ == 0) order.push_back(key);
  });
  for (const auto& key : order) {
    const int n = times[key];
    diagnostics.note(key.first, key.second + (n > 1 ? " (" + std::to_string(n) + " nodes)" : ""));
  }
  return counts;
}

}  // namespace spmd

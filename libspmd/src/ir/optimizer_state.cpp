#include "spmd/ir/optimizer_state.h"

#include "spmd/support/text.h"

namespace spmd {
namespace {

const char* suffixOf(OptimizerState state) {
  switch (state) {
    case OptimizerState::Step: return ".step";
    case OptimizerState::ExpAvg: return ".exp_avg";
    case OptimizerState::ExpAvgSq: return ".exp_avg_sq";
    case OptimizerState::MaxExpAvgSq: return ".max_exp_avg_sq";
    case OptimizerState::MomentumBuffer: return ".momentum_buffer";
  }
  return "";
}

}  // namespace

std::string optimizerStateName(const std::string& param, OptimizerState state) { return param + suffixOf(state); }

std::optional<OptimizerState> optimizerStateOf(const std::string& inputName) {
  // Longest suffixes first: ".exp_avg_sq" also ends in no other suffix, but
  // keep the order safe for additions.
  for (OptimizerState s : {OptimizerState::MaxExpAvgSq, OptimizerState::ExpAvgSq, OptimizerState::ExpAvg,
                           OptimizerState::MomentumBuffer, OptimizerState::Step}) {
    // A parameter's name before the suffix: ".exp_avg" alone is no state.
    const std::string_view suffix = suffixOf(s);
    if (inputName.size() > suffix.size() && endsWith(inputName, suffix)) return s;
  }
  return std::nullopt;
}

}  // namespace spmd

// The optimizer's state inputs, named as the file contract has them
// (<param>.exp_avg, ...): the JSON dump and the artifact mark state by name
// only, so the names are made and recognised here and nowhere else.
#pragma once

#include <optional>
#include <string>

namespace spmd {

enum class OptimizerState {
  Step,            // Adam/AdamW: <param>.step (f32[])
  ExpAvg,          // Adam/AdamW: <param>.exp_avg
  ExpAvgSq,        // Adam/AdamW: <param>.exp_avg_sq
  MaxExpAvgSq,     // Adam/AdamW with amsgrad: <param>.max_exp_avg_sq
  MomentumBuffer,  // SGD with momentum: <param>.momentum_buffer
};

// "<param>.exp_avg" for (param, ExpAvg).
std::string optimizerStateName(const std::string& param, OptimizerState state);
// What kind of state a state input's name says it is, if any.
std::optional<OptimizerState> optimizerStateOf(const std::string& inputName);

}  // namespace spmd

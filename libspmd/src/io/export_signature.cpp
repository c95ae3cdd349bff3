// The program's signature: placeholders, their types and the outputs spmd takes.
#include "export_internal.h"

#include "spmd/support/diagnostic.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

#include <algorithm>

namespace spmd {
namespace export_detail {
namespace {

using Tag = ser::Argument::Tag;

std::string exprOf(const ser::SymInt& s) {
  return s.tag() == ser::SymInt::Tag::AS_EXPR ? s.get_as_expr().get_expr_str() : std::to_string(s.get_as_int());
}

}  // namespace


std::vector<Placeholder> placeholders(const ser::GraphSignature& signature) {
  std::vector<Placeholder> all;
  for (const ser::InputSpec& spec : signature.get_input_specs()) {
    switch (spec.tag()) {
      case ser::InputSpec::Tag::USER_INPUT: {
        const ser::Argument& a = spec.get_user_input().get_arg();
        if (a.tag() != Tag::AS_TENSOR) throw Diagnostic("graph_signature", "a user input that is no tensor: spmd's data inputs are tensors");
        all.push_back({a.get_as_tensor().get_name(), a.get_as_tensor().get_name(), InputKind::Data});
        break;
      }
      case ser::InputSpec::Tag::PARAMETER:
        all.push_back({spec.get_parameter().get_arg().get_name(), spec.get_parameter().get_parameter_name(), InputKind::Parameter});
        break;
      case ser::InputSpec::Tag::BUFFER:
        all.push_back({spec.get_buffer().get_arg().get_name(), spec.get_buffer().get_buffer_name(), InputKind::Buffer});
        break;
      // A tensor the forward made or held as a plain attribute: kept beside
      // the buffers, under its name in the program's constants.
      case ser::InputSpec::Tag::TENSOR_CONSTANT:
        all.push_back({spec.get_tensor_constant().get_arg().get_name(),
                       spec.get_tensor_constant().get_tensor_constant_name(), InputKind::Buffer});
        break;
      case ser::InputSpec::Tag::CUSTOM_OBJ:
        throw Diagnostic("graph_signature", "custom object '" + spec.get_custom_obj().get_custom_obj_name() +
                                                "': spmd takes programs of tensors");
      case ser::InputSpec::Tag::TOKEN:
        throw Diagnostic("graph_signature", "an effect token: programs with side effects are not supported");
      default:
        throw Diagnostic("graph_signature", "an input kind spmd does not read");
    }
  }
  return all;
}

const ser::TensorMeta& metaOf(const ser::Graph& graph, const std::string& name) {
  auto it = graph.get_tensor_values().find(name);
  if (it == graph.get_tensor_values().end()) throw Diagnostic("tensor_values", "no type for input '" + name + "'");
  return it->second;
}

InputSpec dataSpec(const ser::Graph& graph, const Placeholder& p, const std::vector<InputSpec>& given) {
  const ser::TensorMeta& meta = metaOf(graph, p.argName);
  InputSpec spec{p.name, scalarTypeOf(meta.get_dtype(), "input '" + p.name + "'"), {}};
  auto it = std::find_if(given.begin(), given.end(), [&](const InputSpec& s) { return s.name == p.name; });
  const std::string where = "--input " + p.name;
  if (it != given.end() && it->dtype != spec.dtype) {
    throw Diagnostic(where, std::string("the program's input '") + p.name + "' is " + c10::toString(spec.dtype) +
                                ", not " + c10::toString(it->dtype));
  }
  if (it != given.end() && it->shape.size() != meta.get_sizes().size()) {
    throw Diagnostic(where, "the program's input '" + p.name + "' has " + std::to_string(meta.get_sizes().size()) +
                                " dimensions, not " + std::to_string(it->shape.size()));
  }
  for (size_t d = 0; d < meta.get_sizes().size(); ++d) {
    const ser::SymInt& size = meta.get_sizes()[d];
    if (size.tag() == ser::SymInt::Tag::AS_INT) {
      if (it != given.end() && it->shape[d] != size.get_as_int()) {
        throw Diagnostic(where, "dimension " + std::to_string(d) + " of the program's input '" + p.name + "' is " +
                                    std::to_string(size.get_as_int()) + ", not " + std::to_string(it->shape[d]));
      }
      spec.shape.push_back(size.get_as_int());
    } else if (it != given.end()) {
      spec.shape.push_back(it->shape[d]);
    } else {
      throw Diagnostic("input '" + p.name + "'", "dimension " + std::to_string(d) + " is symbolic (" + exprOf(size) +
                                                     "): give its per-rank size with --input " + p.name + ":...");
    }
  }
  return spec;
}

at::Tensor metaTensor(const ser::TensorMeta& meta, const std::string& name) {
  std::vector<int64_t> sizes, strides;
  for (const auto& s : meta.get_sizes()) {
    if (s.tag() != ser::SymInt::Tag::AS_INT) throw Diagnostic("'" + name + "'", "a parameter or buffer of symbolic size");
    sizes.push_back(s.get_as_int());
  }
  for (const auto& s : meta.get_strides()) {
    if (s.tag() != ser::SymInt::Tag::AS_INT) throw Diagnostic("'" + name + "'", "a parameter or buffer of symbolic stride");
    strides.push_back(s.get_as_int());
  }
  const auto options = at::TensorOptions().dtype(scalarTypeOf(meta.get_dtype(), "'" + name + "'")).device(at::kMeta);
  if (strides.size() != sizes.size()) return at::empty(sizes, options);
  return at::empty_strided(sizes, strides, options);
}

void refuseUnsupportedOutputs(const ser::GraphSignature& signature) {
  for (const ser::OutputSpec& spec : signature.get_output_specs()) {
    switch (spec.tag()) {
      case ser::OutputSpec::Tag::USER_OUTPUT:
      case ser::OutputSpec::Tag::LOSS_OUTPUT:
      case ser::OutputSpec::Tag::BUFFER_MUTATION: break;
      case ser::OutputSpec::Tag::USER_INPUT_MUTATION:
        throw Diagnostic("graph_signature", "the program writes its input '" + spec.get_user_input_mutation().get_user_input_name() +
                                                "' in place: spmd's data inputs are read only");
      case ser::OutputSpec::Tag::GRADIENT_TO_PARAMETER:
      case ser::OutputSpec::Tag::GRADIENT_TO_USER_INPUT:
        throw Diagnostic("graph_signature", "a joint forward-backward program: export the forward (the loss); spmd-expand makes the backward");
      default: throw Diagnostic("graph_signature", "an output kind spmd does not read");
    }
  }
}

}  // namespace export_detail
}  // namespace spmd

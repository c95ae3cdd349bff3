#include "spmd/ops/op_traits.h"

#include <map>

namespace spmd {
namespace {

constexpr uint32_t bit(OpTrait t) { return static_cast<uint32_t>(t); }

constexpr uint32_t kCollective = bit(OpTrait::Collective);
constexpr uint32_t kHostSync = bit(OpTrait::SyncsWithHost);
constexpr uint32_t kMayAlias = bit(OpTrait::MayCopyOrAlias);
constexpr uint32_t kListViews = bit(OpTrait::ViewsEachListElement);
constexpr uint32_t kView = bit(OpTrait::ViewOfFirstArgument);
constexpr uint32_t kRandom = bit(OpTrait::Random);

// Every op with a trait, sorted by name.
const std::map<std::string, uint32_t>& traitTable() {
  static const std::map<std::string, uint32_t> table = {
      {"aten::_fused_dropout", kRandom},
      {"aten::_local_scalar_dense", kHostSync},
      {"aten::_unique", kHostSync},
      {"aten::_unique2", kHostSync},
      {"aten::_unsafe_view", kView},
      {"aten::alpha_dropout", kMayAlias | kRandom},
      {"aten::bernoulli", kRandom},
      {"aten::broadcast_tensors", kListViews},
      {"aten::cauchy", kRandom},
      {"aten::contiguous", kMayAlias},
      {"aten::dropout", kMayAlias | kRandom},
      // Counts the distinct indices on the host to size its segments.
      {"aten::embedding_backward", kHostSync},
      {"aten::embedding_dense_backward", kHostSync},
      {"aten::exponential", kRandom},
      {"aten::feature_alpha_dropout", kMayAlias | kRandom},
      {"aten::feature_dropout", kMayAlias | kRandom},
      {"aten::flatten", kMayAlias},
      {"aten::geometric", kRandom},
      {"aten::item", kHostSync},
      {"aten::log_normal", kRandom},
      {"aten::masked_select", kHostSync},
      {"aten::meshgrid", kListViews},
      {"aten::multinomial", kRandom},
      {"aten::native_dropout", kRandom},
      {"aten::nonzero", kHostSync},
      {"aten::normal", kRandom},
      {"aten::poisson", kRandom},
      {"aten::rand", kRandom},
      {"aten::rand_like", kRandom},
      {"aten::randint", kRandom},
      {"aten::randint_like", kRandom},
      {"aten::randn", kRandom},
      {"aten::randn_like", kRandom},
      {"aten::randperm", kRandom},
      {"aten::reshape", kMayAlias},
      {"aten::reshape_as", kMayAlias},
      {"aten::resolve_conj", kMayAlias},
      {"aten::resolve_neg", kMayAlias},
      {"aten::rrelu", kRandom},
      {"aten::rrelu_with_noise", kRandom},
      // Returns its input unchanged when the shape already fits.
      {"aten::sum_to_size", kMayAlias},
      {"aten::to", kMayAlias},
      {"aten::type_as", kMayAlias},
      {"aten::uniform", kRandom},
      {"aten::unique", kHostSync},
      {"aten::unique_consecutive", kHostSync},
      {"aten::unique_dim", kHostSync},
      {"spmd::all_reduce", kCollective},
      {"spmd::broadcast", kCollective},
      {"spmd::bucket_start", kCollective},
      {"spmd::bucket_wait", kCollective},
      {"spmd::dropout_seed", kRandom},
  };
  return table;
}

}  // namespace

bool hasTrait(const std::string& op, OpTrait trait) {
  auto it = traitTable().find(op);
  return it != traitTable().end() && (it->second & bit(trait)) != 0;
}

}  // namespace spmd

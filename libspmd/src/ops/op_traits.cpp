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
constexpr uint32_t kStrided = bit(OpTrait::StridedView);
constexpr uint32_t kOwn = bit(OpTrait::OwnResults);

// Every op with a trait, sorted by name.
const std::map<std::string, uint32_t>& traitTable() {
  static const std::map<std::string, uint32_t> table = {
      {"aten::_fused_dropout", kRandom},
      {"aten::_local_scalar_dense", kHostSync},
      {"aten::_unique", kHostSync},
      {"aten::_unique2", kHostSync},
      {"aten::_unsafe_view", kView},
      {"aten::alpha_dropout", kMayAlias | kRandom},
      {"aten::as_strided", kStrided},
      {"aten::bernoulli", kRandom},
      {"aten::broadcast_tensors", kListViews},
      {"aten::cauchy", kRandom},
      {"aten::contiguous", kMayAlias},
      {"aten::diagonal", kStrided},
      {"aten::dropout", kMayAlias | kRandom},
      // Counts the distinct indices on the host to size its segments.
      {"aten::embedding_backward", kHostSync},
      {"aten::embedding_dense_backward", kHostSync},
      {"aten::expand", kStrided},
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
      {"aten::narrow", kStrided},
      {"aten::native_dropout", kRandom},
      {"aten::nonzero", kHostSync},
      {"aten::normal", kRandom},
      {"aten::permute", kStrided},
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
      {"aten::select", kStrided},
      {"aten::slice", kStrided},
      {"aten::split", kStrided},
      {"aten::split_with_sizes", kStrided},
      // Returns its input unchanged when the shape already fits.
      {"aten::sum_to_size", kMayAlias},
      {"aten::to", kMayAlias},
      {"aten::transpose", kStrided},
      {"aten::type_as", kMayAlias},
      {"aten::uniform", kRandom},
      {"aten::unique", kHostSync},
      {"aten::unique_consecutive", kHostSync},
      {"aten::unique_dim", kHostSync},
      {"spmd::all_reduce", kCollective},
      {"spmd::broadcast", kCollective},
      {"spmd::bucket_start", kCollective},
      {"spmd::bucket_wait", kCollective},
      {"spmd::reduce_scatter", kCollective},
      {"spmd::all_gather", kCollective},
      {"spmd::shard", kCollective},
      {"spmd::gather_start", kCollective},
      {"spmd::gather_wait", kCollective},
      {"spmd::dropout_seed", kRandom},
      {"spmd::flat_cat", kOwn},
      // Each reads its offsets on the host.
      {"spmd::grouped_mm", kHostSync},
      {"spmd::grouped_mm_weight_grad", kHostSync},
      {"spmd::fused_adam", kOwn},
  };
  return table;
}

}  // namespace

bool hasTrait(const std::string& op, OpTrait trait) {
  auto it = traitTable().find(op);
  return it != traitTable().end() && (it->second & bit(trait)) != 0;
}

CollectiveKind collectiveKind(const std::string& op) {
  static const std::map<std::string, CollectiveKind> kinds = {
      {"spmd::all_reduce", CollectiveKind::AllReduce},
      {"spmd::broadcast", CollectiveKind::Broadcast},
      {"spmd::bucket_start", CollectiveKind::BucketStart},
      {"spmd::bucket_wait", CollectiveKind::BucketWait},
      {"spmd::reduce_scatter", CollectiveKind::ReduceScatter},
      {"spmd::all_gather", CollectiveKind::AllGather},
      {"spmd::shard", CollectiveKind::Shard},
      {"spmd::gather_start", CollectiveKind::GatherStart},
      {"spmd::gather_wait", CollectiveKind::GatherWait},
  };
  auto it = kinds.find(op);
  return it == kinds.end() ? CollectiveKind::None : it->second;
}

std::vector<size_t> listsWrittenInPlace(const std::string& op) {
  if (op.rfind("aten::_foreach_", 0) == 0) return {0};
  if (op == "spmd::fused_adam") return {0, 2, 3, 4};
  return {};
}

}  // namespace spmd

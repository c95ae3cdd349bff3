// How a sharded step (spmd-split --shard) cuts a tensor across `world`
// ranks: along dim 0 into `world` equal shards of ceil(rows / world) rows,
// the last ones padded with zero rows; a 0-dim tensor counts as one row.
// Rank r holds shard r. The shard pass, spmd-lower, spmd-run and the
// checkpoint merge (python/spmd_checkpoint) all cut this way.
#pragma once

#include <cstdint>
#include <vector>

namespace spmd {

inline int64_t shardRowsOf(const std::vector<int64_t>& whole, int64_t world) {
  const int64_t rows = whole.empty() ? 1 : whole[0];
  return (rows + world - 1) / world;
}

// The shape of one rank's shard of a tensor of shape `whole`.
inline std::vector<int64_t> shardShapeOf(const std::vector<int64_t>& whole, int64_t world) {
  std::vector<int64_t> shape = {shardRowsOf(whole, world)};
  if (!whole.empty()) shape.insert(shape.end(), whole.begin() + 1, whole.end());
  return shape;
}

// Whether `shard` is the shape of one rank's shard of a tensor of shape
// `whole` (and not `whole` itself): an input of a sharded step whose weights
// or checkpoint hold the whole tensor.
inline bool isShardOf(const std::vector<int64_t>& shard, const std::vector<int64_t>& whole, int64_t world) {
  return world >= 1 && shard != whole && shardShapeOf(whole, world) == shard;
}

}  // namespace spmd

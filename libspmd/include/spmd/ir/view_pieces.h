// A view of a contiguous copy, said again as views of what was copied.
//
// `y = x.contiguous()` followed by views of `y` reads x's elements in an
// order that only the shapes decide. Where each dimension of the final view
// walks one dimension of x (or a factor of one, after a split), the same
// elements are views of x itself: unflatten, select, permute. Those are
// valid on x whatever its strides, so the copy can go (copies-to-views).
// A view dimension that merges factors of two of x's dimensions cannot be a
// view of a strided x; it is given as its factors ("finer"), for readers
// that can take them (a stack, viewed back afterwards).
//
// Pure shape arithmetic: no tensors, no graph.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace spmd {

// Part of a view dimension: `size` steps of `step` elements within the
// copy's dimension `dim` (the copy's own index along that dimension).
struct ViewPiece {
  int64_t dim = 0;
  int64_t step = 1;
  int64_t size = 1;
};

// One view op of the recipe: an unflatten of `dim` into `sizes`, or a
// select of `index` along `dim`.
struct ViewStep {
  bool select = false;
  int64_t dim = 0;
  int64_t index = 0;
  std::vector<int64_t> sizes;
};

// How to make the view from the copied tensor: `steps` in order, then
// `permutation`. The result has `finerShape` (every view dimension's pieces,
// outer first; size-1 view dimensions left out).
struct ViewRecipe {
  std::vector<ViewStep> steps;
  std::vector<int64_t> permutation;
  std::vector<int64_t> finerShape;
  // Per view dimension, how many dimensions of finerShape it became (0 for
  // a size-1 one).
  std::vector<int64_t> piecesPerDim;
  // Whether some view dimension is made of several pieces (then the result
  // is only reshapeable to the view's shape, not viewable, on a strided input).
  bool split = false;
  // Whether the view's last dimension is one piece walking the copy's last
  // dimension with step 1 (readers that need a unit last stride).
  bool lastIsUnitStepOfLastDim = false;
};

// The recipe for the view (sizes, strides, offset) of a contiguous tensor of
// shape `copied`, or nullopt where some element order is no view of a
// strided tensor of that shape (a dimension walked twice, a step that does
// not tile a dimension, a stride of 0).
std::optional<ViewRecipe> viewOfContiguousCopy(const std::vector<int64_t>& copied, const std::vector<int64_t>& sizes,
                                               const std::vector<int64_t>& strides, int64_t offset);

// Where `view` (sizes and strides of a contiguous tensor of shape `base`,
// offset 0) is that tensor's dimensions in another order, with size-1
// dimensions added or dropped: for each dimension of `view`, the dimension
// of `base` it walks (-1 for a size-1 one). nullopt otherwise.
std::optional<std::vector<int64_t>> permutationOfContiguous(const std::vector<int64_t>& base,
                                                            const std::vector<int64_t>& sizes,
                                                            const std::vector<int64_t>& strides, int64_t offset);

}  // namespace spmd

#include "spmd/ir/view_pieces.h"

#include <algorithm>

namespace spmd {
namespace {

std::vector<int64_t> contiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * std::max<int64_t>(shape[d], 1);
  return strides;
}

// A piece with the view dimension it belongs to and its rank there (0: outer).
struct PlacedPiece {
  ViewPiece piece;
  size_t viewDim = 0;
  size_t rank = 0;
};

// The pieces of one view dimension of `size` elements `stride` apart, outer
// first, or nullopt where the walk is no whole steps of the copy's dimensions.
std::optional<std::vector<ViewPiece>> piecesOf(const std::vector<int64_t>& copied, const std::vector<int64_t>& cst,
                                               int64_t size, int64_t stride) {
  std::vector<ViewPiece> innerFirst;
  int64_t left = size;
  while (left > 1) {
    // The outermost non-unit dimension whose elements are at most `stride` apart.
    int64_t dim = -1;
    for (size_t k = 0; k < copied.size(); ++k) {
      if (copied[k] > 1 && cst[k] <= stride) {
        dim = static_cast<int64_t>(k);
        break;
      }
    }
    if (dim < 0 || stride % cst[dim] != 0) return std::nullopt;
    const int64_t step = stride / cst[dim];
    if (step * left <= copied[dim]) {
      innerFirst.push_back({dim, step, left});
      left = 1;
    } else {
      if (copied[dim] % step != 0) return std::nullopt;
      const int64_t inner = copied[dim] / step;
      if (inner <= 1 || left % inner != 0) return std::nullopt;
      innerFirst.push_back({dim, step, inner});
      left /= inner;
      stride = cst[dim] * copied[dim];
    }
  }
  std::reverse(innerFirst.begin(), innerFirst.end());
  return innerFirst;
}

}  // namespace

std::optional<ViewRecipe> viewOfContiguousCopy(const std::vector<int64_t>& copied, const std::vector<int64_t>& sizes,
                                               const std::vector<int64_t>& strides, int64_t offset) {
  if (sizes.empty() || sizes.size() != strides.size() || offset < 0) return std::nullopt;
  const std::vector<int64_t> cst = contiguousStrides(copied);
  int64_t numel = 1;
  for (int64_t s : copied) numel *= s;
  if (numel == 0 || offset >= numel) return std::nullopt;

  ViewRecipe recipe;
  std::vector<std::vector<ViewPiece>> piecesByView(sizes.size());
  std::vector<std::vector<PlacedPiece>> byDim(copied.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return std::nullopt;
    if (sizes[i] == 1) {
      recipe.piecesPerDim.push_back(0);
      continue;
    }
    if (strides[i] <= 0) return std::nullopt;  // a broadcast reads elements twice
    const std::optional<std::vector<ViewPiece>> pieces = piecesOf(copied, cst, sizes[i], strides[i]);
    if (!pieces) return std::nullopt;
    recipe.piecesPerDim.push_back(static_cast<int64_t>(pieces->size()));
    piecesByView[i] = *pieces;
    recipe.split = recipe.split || pieces->size() > 1;
    for (size_t r = 0; r < pieces->size(); ++r) byDim[(*pieces)[r].dim].push_back({(*pieces)[r], i, r});
  }

  // Each dimension of the copy: its pieces must tile a block of it, which the
  // offset's digit there places (the factors above and below it selected).
  std::vector<std::pair<size_t, size_t>> order;  // the pieces as the steps leave them: (view dim, rank)
  std::vector<ViewStep> steps;
  for (size_t j = copied.size(); j-- > 0;) {
    const int64_t digit = (offset / cst[j]) % copied[j];
    std::vector<PlacedPiece>& pieces = byDim[j];
    const int64_t dim = static_cast<int64_t>(j);
    if (pieces.empty()) {
      steps.push_back({true, dim, digit, {}});
      continue;
    }
    std::sort(pieces.begin(), pieces.end(),
              [](const PlacedPiece& a, const PlacedPiece& b) { return a.piece.step > b.piece.step; });
    for (size_t k = 0; k + 1 < pieces.size(); ++k) {
      if (pieces[k].piece.step != pieces[k + 1].piece.step * pieces[k + 1].piece.size) return std::nullopt;
    }
    const int64_t bottom = pieces.back().piece.step, span = pieces.front().piece.step * pieces.front().piece.size;
    if (copied[j] % span != 0 || (digit % span) / bottom != 0) return std::nullopt;
    const int64_t top = copied[j] / span;
    std::vector<int64_t> factors;
    if (top > 1) factors.push_back(top);
    for (const PlacedPiece& p : pieces) factors.push_back(p.piece.size);
    if (bottom > 1) factors.push_back(bottom);
    if (factors.size() > 1) steps.push_back({false, dim, 0, factors});
    if (bottom > 1) steps.push_back({true, dim + static_cast<int64_t>(factors.size()) - 1, digit % bottom, {}});
    if (top > 1) steps.push_back({true, dim, digit / span, {}});
    std::vector<std::pair<size_t, size_t>> here;
    for (const PlacedPiece& p : pieces) here.push_back({p.viewDim, p.rank});
    order.insert(order.begin(), here.begin(), here.end());
  }
  recipe.steps = steps;

  // Permute the pieces into the view's order.
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (int64_t r = 0; r < recipe.piecesPerDim[i]; ++r) {
      const auto at = std::find(order.begin(), order.end(), std::make_pair(i, static_cast<size_t>(r)));
      recipe.permutation.push_back(at - order.begin());
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (const ViewPiece& p : piecesByView[i]) recipe.finerShape.push_back(p.size);
  }
  const std::vector<ViewPiece>& last = piecesByView.back();
  recipe.lastIsUnitStepOfLastDim =
      last.size() == 1 && last[0].dim == static_cast<int64_t>(copied.size()) - 1 && last[0].step == 1;
  return recipe;
}

std::optional<std::vector<int64_t>> permutationOfContiguous(const std::vector<int64_t>& base,
                                                            const std::vector<int64_t>& sizes,
                                                            const std::vector<int64_t>& strides, int64_t offset) {
  if (offset != 0 || sizes.size() != strides.size()) return std::nullopt;
  const std::vector<int64_t> cst = contiguousStrides(base);
  std::vector<bool> used(base.size(), false);
  std::vector<int64_t> walks;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 1) {
      walks.push_back(-1);
      continue;
    }
    int64_t found = -1;
    for (size_t k = 0; k < base.size(); ++k) {
      if (!used[k] && base[k] == sizes[i] && cst[k] == strides[i]) found = static_cast<int64_t>(k);
    }
    if (found < 0) return std::nullopt;
    used[found] = true;
    walks.push_back(found);
  }
  for (size_t k = 0; k < base.size(); ++k) {
    if (base[k] != 1 && !used[k]) return std::nullopt;
  }
  return walks;
}

}  // namespace spmd

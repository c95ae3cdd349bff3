// spmd::flat_cat(Tensor[] tensors, ScalarType dtype): the elements of each
// tensor in row-major order, one after the other, in `dtype`: what
// cat([t.to(dtype).reshape(-1) for t in tensors]) makes, with each tensor
// read once, whatever its strides, and converted as it is copied
// (spmd-lower's pack-buckets puts it in place of a bucket's cast, reshape
// and cat copies). Each piece is one ATen copy_ into its slice of the
// result, on every device (the same conversion as the casts it replaces),
// but for runs of contiguous pieces already in `dtype`: one cat_out each.
#include "spmd/ops/spmd_ops.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

namespace spmd {
namespace {

at::Tensor flatCat(at::TensorList tensors, at::ScalarType dtype) {
  TORCH_CHECK(!tensors.empty(), "spmd::flat_cat: no tensors");
  int64_t total = 0;
  for (const at::Tensor& t : tensors) total += t.numel();
  at::Tensor out = at::empty({total}, tensors[0].options().dtype(dtype));
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size();) {
    // A run of contiguous pieces already in `dtype` (LayerNorm's f32
    // gradients in a bf16 step) is one cat into its slice: on CUDA one
    // batched kernel, where a copy_ each was one memcpy launch each.
    size_t end = i;
    int64_t run = 0;
    while (end < tensors.size() && tensors[end].scalar_type() == dtype && tensors[end].is_contiguous()) {
      run += tensors[end++].numel();
    }
    if (end - i > 1) {
      std::vector<at::Tensor> flat;
      for (size_t k = i; k < end; ++k) flat.push_back(tensors[k].view({-1}));
      at::Tensor slice = out.narrow(0, offset, run);
      at::cat_out(slice, flat, 0);
      offset += run;
      i = end;
      continue;
    }
    const at::Tensor& t = tensors[i++];
    out.narrow(0, offset, t.numel()).view(t.sizes()).copy_(t);
    offset += t.numel();
  }
  return out;
}

}  // namespace

void ensureFlatCatOpsRegistered() {}

}  // namespace spmd

TORCH_LIBRARY_FRAGMENT(spmd, m) { m.def("flat_cat(Tensor[] tensors, ScalarType dtype) -> Tensor"); }

TORCH_LIBRARY_IMPL(spmd, CompositeExplicitAutograd, m) { m.impl("flat_cat", &spmd::flatCat); }

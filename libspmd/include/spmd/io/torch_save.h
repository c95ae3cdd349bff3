// Reading files written by Python's torch.save (the default zip format), on
// LibTorch 1.13 and 2.x alike.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>

namespace spmd {

// The object torch.save wrote: tensors (CPU, sharing storage where the saved
// tensors did; nn.Parameter becomes its tensor), dicts (GenericDict; keys
// str or int; OrderedDict becomes a plain dict), lists (GenericList),
// tuples, ints, floats, bools, strings and None. Containers whose keys or
// elements are all of one of these kinds are typed as such, else Any.
// Throws Diagnostic (where "") for anything else, for files that are not
// torch.save zip files and for damaged ones; loadTorchSave also names the
// file in it.
c10::IValue loadTorchSave(const std::string& path);
c10::IValue loadTorchSaveBytes(const std::string& bytes);

}  // namespace spmd

// Reading and writing files in Python's torch.save format (the default zip
// format).
#pragma once

#include "spmd/support/diagnostic.h"

#include <ATen/core/ivalue.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace spmd {

class MappedFile;
struct ZipMember;

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
// A torch.save file stored uncompressed as `member` of the zip `mapping`
// holds (a .pt2's state dict): its storages are copy-on-write views of the
// mapping. Throws Diagnostic (where: the member's name).
c10::IValue loadTorchSaveMember(const std::shared_ptr<MappedFile>& mapping, const ZipMember& member);

// The tensors of a TorchScript module file (torch.jit.save) by attribute
// path ("blocks.0.attn.weight"): every tensor attribute of the module and of
// its submodules, its parameters and buffers among them, as copy-on-write
// views of the mapped file: nothing is copied into the heap, as
// torch::jit::load does with every storage. The same pickle reader as
// loadTorchSave, which also takes TorchScript's objects (dicts of their
// attributes). Throws Diagnostic naming the file when it is not a TorchScript
// zip or its data.pkl holds what the reader does not know; jit::load reads those.
// Throws DamagedRecord, which no other reader should try again, when a storage
// record is missing or its size is not its tensors' (a member cut short: LibTorch's
// loader would make tensors over the missing bytes).
std::map<std::string, at::Tensor> loadTorchScriptTensors(const std::string& path);

class DamagedRecord : public Diagnostic {
 public:
  using Diagnostic::Diagnostic;
};

// The bytes of a torch.save zip file holding a dict {name: tensor}, in the
// given order: what Python's torch.save(dict, f) writes (pickle protocol 2),
// using only the globals that torch.load(weights_only=True) allows
// (torch._utils._rebuild_tensor_v2, collections.OrderedDict and the
// torch.<Type>Storage classes). Each tensor is saved as a contiguous CPU copy
// with requires_grad False, in a storage of its own. Dtypes: float32,
// float64, float16, bfloat16, int64, int32, int16, int8, uint8 and bool.
// Throws Diagnostic (where "") for other dtypes and for a name given twice.
std::string saveTorchSave(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// The bytes of a torch.save zip file holding `value`: dicts (str or int
// keys), lists, tuples, ints, floats, bools, None, strings and tensors,
// nested (an optimizer's state_dict()), with the same globals and tensor
// handling as saveTorchSave. Throws Diagnostic (where "") for anything else.
std::string saveTorchSaveValue(const c10::IValue& value);

}  // namespace spmd

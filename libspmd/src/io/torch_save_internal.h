// What torch_save.cpp (the zip archive), pickle_read.cpp and pickle_write.cpp
// share: the error helpers, the pickle opcodes and globals, and the entry
// points of the pickle reader and writer.
#pragma once

#include "spmd/io/zip_members.h"
#include "spmd/support/diagnostic.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace caffe2 {
namespace serialize {
class PyTorchStreamReader;
}  // namespace serialize
}  // namespace caffe2

namespace spmd {

class MappedFile;

namespace torch_save_detail {

[[noreturn]] inline void fail(const std::string& what) { throw Diagnostic("", what); }

inline std::string firstLine(const c10::Error& e) {
  std::string what = e.what_without_backtrace();
  return what.substr(0, what.find('\n'));
}

// ---- the pickle opcodes torch.save's pickles use -------------------------------

namespace op {
enum : uint8_t {
  MARK = '(', STOP = '.', BINFLOAT = 'G', BININT = 'J', BININT1 = 'K', BININT2 = 'M',
  NONE = 'N', BINPERSID = 'Q', REDUCE = 'R', BINUNICODE = 'X', APPEND = 'a', BUILD = 'b',
  GLOBAL = 'c', APPENDS = 'e', BINGET = 'h', LONG_BINGET = 'j', EMPTY_LIST = ']',
  BINPUT = 'q', LONG_BINPUT = 'r', SETITEM = 's', TUPLE = 't', SETITEMS = 'u',
  EMPTY_DICT = '}', EMPTY_TUPLE = ')', PROTO = 0x80, TUPLE1 = 0x85, TUPLE2 = 0x86,
  TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, SHORT_BINUNICODE = 0x8c,
  BINUNICODE8 = 0x8d, STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95, NEWOBJ = 0x81,
};
}  // namespace op

// ---- the globals torch.save's pickles use ------------------------------------

const char* const kRebuildTensor = "torch._utils._rebuild_tensor_v2";
const char* const kRebuildParameter = "torch._utils._rebuild_parameter";
const char* const kRebuildParameterWithState = "torch._utils._rebuild_parameter_with_state";
const char* const kOrderedDict = "collections.OrderedDict";

// How unpickle reads: what the pickle may hold, and where storages come from.
struct UnpickleOptions {
  // torch.jit.save's data.pkl: TorchScript objects (__torch__.* classes,
  // made by NEWOBJ and filled by BUILD) become dicts of their attributes.
  bool torchScriptObjects = false;
  // When set, the archive's file mapped: storages are copy-on-write views of
  // it where their alignment allows, not copies.
  std::shared_ptr<MappedFile> mapping;
  // Where the archive lies in `mapping`: a torch.save file stored whole as
  // a member of another zip (a .pt2's state dict) starts at archiveOffset.
  size_t archiveOffset = 0;
  size_t archiveSize = 0;  // 0: to the end of the mapping
};

// The storages of an archive, each read once, so that tensors saved as views
// of one storage share it again (pickle_storages.cpp).
class Storages {
 public:
  Storages(caffe2::serialize::PyTorchStreamReader& reader, const UnpickleOptions& options);
  // A 1-D CPU tensor of `numel` elements over the whole storage `key`.
  at::Tensor get(const std::string& key, at::ScalarType dtype, int64_t numel);

 private:
  at::Tensor read(const std::string& key, at::ScalarType dtype, int64_t numel);
  at::Tensor view(const std::string& key, at::ScalarType dtype, int64_t numel);

  caffe2::serialize::PyTorchStreamReader& reader_;
  std::shared_ptr<MappedFile> mapping_;
  std::unordered_map<std::string, ZipMember> members_;  // by record name, without the archive's folder
  std::unordered_map<std::string, at::Tensor> loaded_;
};

// The object the pickle `data.pkl` holds, each storage it names by persistent
// id read from `reader`'s data/<key> record (pickle_read.cpp).
c10::IValue unpickle(const std::string& pickle, caffe2::serialize::PyTorchStreamReader& reader,
                     const UnpickleOptions& options = {});

// The tensors as saveTorchSave writes them: contiguous CPU copies, checked.
std::vector<std::pair<std::string, at::Tensor>> prepare(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// The pickle of a dict of the prepared tensors, each in its storage
// data/<i> (pickle_write.cpp).
std::string pickleTensorDict(const std::vector<std::pair<std::string, at::Tensor>>& prepared);

// `v` with each tensor replaced by a contiguous CPU copy, also appended to
// `tensors` in depth-first order (the order pickleValue names storages in).
c10::IValue prepareValue(const c10::IValue& v, std::vector<at::Tensor>& tensors);
// The pickle of a prepared object (pickle_write.cpp).
std::string pickleValue(const c10::IValue& prepared);

}  // namespace torch_save_detail
}  // namespace spmd

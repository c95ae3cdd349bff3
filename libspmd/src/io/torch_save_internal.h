// What torch_save.cpp (the zip archive), pickle_read.cpp and pickle_write.cpp
// share: the error helpers, the pickle opcodes and globals, and the entry
// points of the pickle reader and writer.
#pragma once

#include "spmd/support/diagnostic.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace caffe2 {
namespace serialize {
class PyTorchStreamReader;
}  // namespace serialize
}  // namespace caffe2

namespace spmd {
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
  BINUNICODE8 = 0x8d, STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95,
};
}  // namespace op

// ---- the globals torch.save's pickles use ------------------------------------

const char* const kRebuildTensor = "torch._utils._rebuild_tensor_v2";
const char* const kRebuildParameter = "torch._utils._rebuild_parameter";
const char* const kRebuildParameterWithState = "torch._utils._rebuild_parameter_with_state";
const char* const kOrderedDict = "collections.OrderedDict";

// The object the pickle `data.pkl` holds, each storage it names by persistent
// id read from `reader`'s data/<key> record (pickle_read.cpp).
c10::IValue unpickle(const std::string& pickle, caffe2::serialize::PyTorchStreamReader& reader);

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

// Writing the data.pkl of a {name: tensor} dict the way Python's torch.save
// does, opcode for opcode; separate from the zip archive and from the reader.
#include "torch_save_internal.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

namespace spmd {
namespace torch_save_detail {
namespace {

// ---- writing: the pickle Python's torch.save writes ----------------------------

// The storage class of each dtype saveTorchSave writes.
c10::optional<std::string> storageGlobal(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return std::string("torch.FloatStorage");
    case at::kDouble: return std::string("torch.DoubleStorage");
    case at::kHalf: return std::string("torch.HalfStorage");
    case at::kBFloat16: return std::string("torch.BFloat16Storage");
    case at::kLong: return std::string("torch.LongStorage");
    case at::kInt: return std::string("torch.IntStorage");
    case at::kShort: return std::string("torch.ShortStorage");
    case at::kChar: return std::string("torch.CharStorage");
    case at::kByte: return std::string("torch.ByteStorage");
    case at::kBool: return std::string("torch.BoolStorage");
    default: return c10::nullopt;
  }
}

// A protocol 2 pickler for what torch.save writes of a {str: tensor} dict,
// emitting what Python's pickle.Pickler emits: every str, non-empty tuple,
// dict and REDUCE result is memoized as it is made; globals and the strings
// 'storage' and 'cpu' (one object each in Python) are fetched from the memo
// when they come again.
class Pickler {
 public:
  Pickler() {
    out_.push_back(char(op::PROTO));
    out_.push_back(char(2));
  }

  std::string finish() {
    out_.push_back(char(op::STOP));
    return std::move(out_);
  }

  // Any object torch.save writes for a state dict: dicts (str or int keys),
  // lists, tuples, ints, floats, bools, None, strings and tensors, nested.
  // Tensors must be prepared (contiguous CPU tensors); the k-th tensor met
  // in depth-first order gets storage data/<k>.
  void value(const c10::IValue& v) {
    if (v.isTensor()) {
      tensor(v.toTensor(), std::to_string(tensorsSeen_++));
    } else if (v.isGenericDict()) {
      dict(v.toGenericDict());
    } else if (v.isList()) {
      list(v.toListRef());
    } else if (v.isTuple()) {
      const auto& elements = v.toTupleRef().elements();
      tuple(std::vector<c10::IValue>(elements.begin(), elements.end()));
    } else if (v.isDouble()) {
      opcode(op::BINFLOAT);
      const double d = v.toDouble();
      uint64_t bits = 0;
      std::memcpy(&bits, &d, sizeof bits);
      for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));  // big-endian
    } else if (v.isBool()) {
      opcode(v.toBool() ? op::NEWTRUE : op::NEWFALSE);
    } else if (v.isInt()) {
      integer(v.toInt());
    } else if (v.isNone()) {
      opcode(op::NONE);
    } else if (v.isString()) {
      string(v.toStringRef());
    } else {
      fail("cannot save a " + v.tagKind() + " in a torch.save file");
    }
  }

  // A dict of the tensors (already contiguous CPU tensors, each with its own
  // storage data/<i>). Like CPython's C pickler (batch_dict_exact): SETITEM
  // for a dict of one, else MARK ... SETITEMS for each 1000 items, and one
  // more (maybe empty) batch after a full one.
  void tensorDict(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
    opcode(op::EMPTY_DICT);
    memoize();
    if (tensors.empty()) return;
    if (tensors.size() == 1) {
      entry(tensors[0], 0);
      opcode(op::SETITEM);
      return;
    }
    const size_t batch = 1000;
    for (size_t start = 0;; start += batch) {
      const size_t end = std::min(start + batch, tensors.size());
      opcode(op::MARK);
      for (size_t i = start; i < end; ++i) entry(tensors[i], i);
      opcode(op::SETITEMS);
      if (end - start < batch) break;
    }
  }

 private:
  // Items as CPython's batched SETITEMS/APPENDS: one item alone with
  // SETITEM/APPEND, else MARK ... per 1000 items.
  template <typename Emit>
  void batched(size_t count, uint8_t single, uint8_t many, const Emit& emit) {
    if (count == 1) {
      emit(0);
      opcode(single);
      return;
    }
    for (size_t start = 0; start < count; start += 1000) {
      opcode(op::MARK);
      for (size_t i = start; i < std::min(start + 1000, count); ++i) emit(i);
      opcode(many);
    }
  }

  void dict(const c10::impl::GenericDict& d) {
    opcode(op::EMPTY_DICT);
    memoize();
    std::vector<std::pair<c10::IValue, c10::IValue>> items;
    for (const auto& item : d) items.emplace_back(item.key(), item.value());
    if (items.empty()) return;
    batched(items.size(), op::SETITEM, op::SETITEMS, [&](size_t i) {
      value(items[i].first);
      value(items[i].second);
    });
  }

  void list(c10::ArrayRef<c10::IValue> elements) {
    opcode(op::EMPTY_LIST);
    memoize();
    if (elements.empty()) return;
    batched(elements.size(), op::APPEND, op::APPENDS, [&](size_t i) { value(elements[i]); });
  }

  void tuple(const std::vector<c10::IValue>& elements) {
    if (elements.empty()) {
      opcode(op::EMPTY_TUPLE);
      return;
    }
    if (elements.size() > 3) opcode(op::MARK);
    for (const auto& e : elements) value(e);
    opcode(elements.size() > 3 ? uint8_t(op::TUPLE) : uint8_t(op::TUPLE1 + elements.size() - 1));
    memoize();
  }

  void entry(const std::pair<std::string, at::Tensor>& named, size_t index) {
    string(named.first);
    tensor(named.second, std::to_string(index));
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
  // backward_hooks), the storage a persistent id
  // ('storage', torch.<Type>Storage, key, 'cpu', numel).
  void tensor(const at::Tensor& t, const std::string& key) {
    global(kRebuildTensor);
    opcode(op::MARK);
    opcode(op::MARK);
    sharedString("storage");
    global(*storageGlobal(t.scalar_type()));
    string(key);
    sharedString("cpu");
    integer(t.numel());
    opcode(op::TUPLE);
    memoize();
    opcode(op::BINPERSID);
    integer(0);
    const std::vector<int64_t> sizes = t.sizes().vec();
    intTuple(sizes);
    intTuple(contiguousStrides(sizes));
    opcode(op::NEWFALSE);
    global(kOrderedDict);
    opcode(op::EMPTY_TUPLE);
    opcode(op::REDUCE);
    memoize();
    opcode(op::TUPLE);
    memoize();
    opcode(op::REDUCE);
    memoize();
  }

  // The strides of a fresh contiguous tensor, as PyTorch gives them.
  static std::vector<int64_t> contiguousStrides(const std::vector<int64_t>& sizes) {
    std::vector<int64_t> strides(sizes.size());
    int64_t stride = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= std::max<int64_t>(sizes[i], 1);
    }
    return strides;
  }

  void opcode(uint8_t code) { out_.push_back(static_cast<char>(code)); }
  void littleEndian(uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }

  void memoize() {
    const uint64_t index = memoSize_++;
    if (index < 256) {
      opcode(op::BINPUT);
      littleEndian(index, 1);
    } else {
      opcode(op::LONG_BINPUT);
      littleEndian(index, 4);
    }
  }
  // Fetches what the memo holds under `name`, else makes it with `make` and
  // memoizes it there.
  void shared(const std::string& name, const std::function<void()>& make) {
    auto it = shared_.find(name);
    if (it == shared_.end()) {
      make();
      shared_.emplace(name, memoSize_);
      memoize();
    } else if (it->second < 256) {
      opcode(op::BINGET);
      littleEndian(it->second, 1);
    } else {
      opcode(op::LONG_BINGET);
      littleEndian(it->second, 4);
    }
  }

  void rawString(const std::string& s) {
    opcode(op::BINUNICODE);
    littleEndian(s.size(), 4);
    out_ += s;
  }
  void string(const std::string& s) {
    rawString(s);
    memoize();
  }
  void sharedString(const std::string& s) {
    shared("str " + s, [&] { rawString(s); });
  }
  void global(const std::string& name) {
    shared("global " + name, [&] {
      const size_t dot = name.rfind('.');
      opcode(op::GLOBAL);
      out_ += name.substr(0, dot) + "\n" + name.substr(dot + 1) + "\n";
    });
  }

  // Python's save_long at protocol 2.
  void integer(int64_t v) {
    if (v >= 0 && v <= 0xff) {
      opcode(op::BININT1);
      littleEndian(uint64_t(v), 1);
    } else if (v >= 0 && v <= 0xffff) {
      opcode(op::BININT2);
      littleEndian(uint64_t(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      opcode(op::BININT);
      littleEndian(uint64_t(uint32_t(int32_t(v))), 4);
    } else {
      // The fewest two's-complement bytes that hold v.
      size_t n = 8;
      while (n > 1) {
        const int64_t high = v >> (8 * (n - 1) - 1);  // the top byte and the sign bit below it
        if (high != 0 && high != -1) break;
        --n;
      }
      opcode(op::LONG1);
      littleEndian(n, 1);
      littleEndian(uint64_t(v), n);
    }
  }
  void intTuple(const std::vector<int64_t>& ints) {
    if (ints.empty()) {
      opcode(op::EMPTY_TUPLE);
      return;
    }
    if (ints.size() > 3) opcode(op::MARK);
    for (int64_t v : ints) integer(v);
    opcode(ints.size() > 3 ? uint8_t(op::TUPLE) : uint8_t(op::TUPLE1 + ints.size() - 1));
    memoize();
  }

  std::string out_;
  uint64_t memoSize_ = 0;
  size_t tensorsSeen_ = 0;
  std::unordered_map<std::string, uint64_t> shared_;  // "global <name>" or "str <text>": its memo index
};

}  // namespace

// The tensors as saveTorchSave writes them: contiguous CPU copies, checked.
std::vector<std::pair<std::string, at::Tensor>> prepare(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<std::pair<std::string, at::Tensor>> prepared;
  std::unordered_map<std::string, bool> seen;
  for (const auto& [name, tensor] : tensors) {
    if (!seen.emplace(name, true).second) fail("cannot save tensor '" + name + "': the name is given twice");
    if (!tensor.defined()) fail("cannot save tensor '" + name + "': it is undefined");
    if (!storageGlobal(tensor.scalar_type())) {
      fail("cannot save tensor '" + name + "': unsupported dtype " + std::string(c10::toString(tensor.scalar_type())));
    }
    prepared.emplace_back(name, tensor.detach().to(at::kCPU).contiguous());
  }
  return prepared;
}

std::string pickleTensorDict(const std::vector<std::pair<std::string, at::Tensor>>& prepared) {
  Pickler pickler;
  pickler.tensorDict(prepared);
  return pickler.finish();
}

c10::IValue prepareValue(const c10::IValue& v, std::vector<at::Tensor>& tensors) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!storageGlobal(t.scalar_type())) {
      fail("cannot save a tensor of dtype " + std::string(c10::toString(t.scalar_type())));
    }
    tensors.push_back(t.detach().to(at::kCPU).contiguous());
    return tensors.back();
  }
  if (v.isGenericDict()) {
    c10::impl::GenericDict out(v.toGenericDict().keyType(), v.toGenericDict().valueType());
    for (const auto& item : v.toGenericDict()) out.insert(item.key(), prepareValue(item.value(), tensors));
    return out;
  }
  if (v.isList()) {
    c10::impl::GenericList out(c10::AnyType::get());
    for (const auto& e : v.toListRef()) out.push_back(prepareValue(e, tensors));
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const auto& e : v.toTupleRef().elements()) elements.push_back(prepareValue(e, tensors));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return v;
}

std::string pickleValue(const c10::IValue& prepared) {
  Pickler pickler;
  pickler.value(prepared);
  return pickler.finish();
}

}  // namespace torch_save_detail
}  // namespace spmd

// torch.save files (the default zip format), read without torch::pickle_load
// and written without torch::pickle_save.
//
// Why this exists: LibTorch 1.13's unpickler (torch::pickle_load) cannot read
// many files that Python's torch.save writes. It lacks opcodes such as
// SETITEM and APPEND, which Python's pickler emits for one-element dicts and
// lists, so even torch.save({'x': t}, f) cannot be read back. This is a small
// pickle machine of our own for what torch.save writes (pickle protocol 2,
// plus the cheap opcodes of protocols 3-5), with one code path for LibTorch
// 1.13 and 2.x. The zip container is read with LibTorch's PyTorchStreamReader:
// <archive>/data.pkl is the pickle, and <archive>/data/<key> holds the raw
// little-endian bytes of each storage the pickle names by persistent id.
//
// Writing: torch::pickle_save's output names torch.jit._pickle globals, which
// torch.load(weights_only=True), the default since PyTorch 2.6, rejects. So
// saveTorchSave pickles a {name: tensor} dict the way Python's torch.save
// does, opcode for opcode, with only the globals weights_only allows.
#include "spmd/io/torch_save.h"

#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/istream_adapter.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

namespace spmd {
namespace {

using caffe2::serialize::PyTorchStreamReader;
using caffe2::serialize::PyTorchStreamWriter;
using caffe2::serialize::ReadAdapterInterface;

[[noreturn]] void fail(const std::string& what) { throw Diagnostic("", what); }

std::string firstLine(const c10::Error& e) {
  std::string what = e.what_without_backtrace();
  return what.substr(0, what.find('\n'));
}

// ---- what the pickle machine's stack and memo hold ---------------------------

// A finished value, or one of the intermediate things torch.save's pickles
// build values from: a global (a function or a storage type), a storage, or
// a tuple (which may hold globals and storages until it is used).
struct Item {
  enum class Kind { Value, Global, Storage, Tuple };
  Kind kind = Kind::Value;
  c10::IValue value;                                  // Value; Storage: a 1-D tensor over all of it
  std::string name;                                   // Global: "module.name"
  std::shared_ptr<const std::vector<Item>> elements;  // Tuple

  static Item of(c10::IValue v) {
    Item item;
    item.value = std::move(v);
    return item;
  }
  static Item global(std::string name) {
    Item item;
    item.kind = Kind::Global;
    item.name = std::move(name);
    return item;
  }
  static Item storage(at::Tensor data) {
    Item item = of(std::move(data));
    item.kind = Kind::Storage;
    return item;
  }
  static Item tuple(std::vector<Item> elements) {
    Item item;
    item.kind = Kind::Tuple;
    item.elements = std::make_shared<const std::vector<Item>>(std::move(elements));
    return item;
  }
};

std::string describe(const Item& item) {
  switch (item.kind) {
    case Item::Kind::Global: return "the global '" + item.name + "'";
    case Item::Kind::Storage: return "a bare storage";
    case Item::Kind::Tuple: return "a tuple";
    case Item::Kind::Value: break;
  }
  return "a value of kind " + std::string(item.value.tagKind());
}

// ---- the globals torch.save's pickles use ------------------------------------

const char* const kRebuildTensor = "torch._utils._rebuild_tensor_v2";
const char* const kRebuildParameter = "torch._utils._rebuild_parameter";
const char* const kRebuildParameterWithState = "torch._utils._rebuild_parameter_with_state";
const char* const kOrderedDict = "collections.OrderedDict";

// The element type of a storage class such as torch.FloatStorage.
c10::optional<at::ScalarType> storageDtype(const std::string& global) {
  static const std::map<std::string, at::ScalarType> dtypes = {
      {"torch.FloatStorage", at::kFloat},   {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},     {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},     {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},   {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},     {"torch.BoolStorage", at::kBool},
      {"torch.ComplexFloatStorage", at::kComplexFloat},
      {"torch.ComplexDoubleStorage", at::kComplexDouble},
      {"torch.UntypedStorage", at::kByte},
  };
  auto it = dtypes.find(global);
  if (it == dtypes.end()) return c10::nullopt;
  return it->second;
}

bool isKnownGlobal(const std::string& name) {
  return name == kRebuildTensor || name == kRebuildParameter || name == kRebuildParameterWithState ||
         name == kOrderedDict || storageDtype(name).has_value();
}

// ---- storages: the archive's data/<key> records ------------------------------

// Each storage is read once, so tensors saved as views of one storage share
// it again.
class Storages {
 public:
  explicit Storages(PyTorchStreamReader& reader) : reader_(reader) {}

  // A 1-D CPU tensor of `numel` elements over the whole storage.
  at::Tensor get(const std::string& key, at::ScalarType dtype, int64_t numel) {
    auto it = loaded_.find(key);
    if (it != loaded_.end()) {
      if (it->second.scalar_type() != dtype) fail("storage '" + key + "' is saved with two dtypes");
      return it->second;
    }
    at::Tensor storage = read(key, dtype, numel);
    loaded_.emplace(key, storage);
    return storage;
  }

 private:
  at::Tensor read(const std::string& key, at::ScalarType dtype, int64_t numel) {
    const std::string record = "data/" + key;
    if (!reader_.hasRecord(record)) fail("missing storage record '" + record + "'");
    at::DataPtr data;
    size_t size = 0;
    std::tie(data, size) = reader_.getRecord(record);
    const size_t expected = static_cast<size_t>(numel) * c10::elementSize(dtype);
    if (numel < 0 || size != expected) {
      fail("storage record '" + record + "' has " + std::to_string(size) + " bytes, expected " +
           std::to_string(expected));
    }
    at::Tensor storage = at::empty({numel}, at::TensorOptions().dtype(dtype));
    if (size > 0) std::memcpy(storage.data_ptr(), data.get(), size);
    return storage;
  }

  PyTorchStreamReader& reader_;
  std::unordered_map<std::string, at::Tensor> loaded_;
};

// ---- the pickle machine --------------------------------------------------------

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

class Unpickler {
 public:
  Unpickler(const std::string& pickle, Storages& storages) : data_(pickle), storages_(storages) {}

  c10::IValue run() {
    while (step()) {
    }
    c10::IValue result = valueOf(pop());
    refineContainerTypes();
    return result;
  }

 private:
  [[noreturn]] void failAt(const std::string& what) const {
    fail(what + " at byte " + std::to_string(opPos_) + " of data.pkl");
  }

  // -- reading the pickle --

  void need(uint64_t n) const {
    if (n > data_.size() - pos_) fail("truncated pickle: data.pkl ends at byte " + std::to_string(data_.size()));
  }
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(data_[pos_++]);
  }
  uint64_t littleEndian(size_t n) {
    need(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }
  std::string bytes(uint64_t n) {
    need(n);
    std::string s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::string line() {
    size_t end = data_.find('\n', pos_);
    if (end == std::string::npos) need(data_.size() - pos_ + 1);
    std::string s = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  int64_t long1() {
    const size_t n = u8();
    if (n > 8) failAt("integer of " + std::to_string(n) + " bytes does not fit in 64 bits");
    uint64_t v = littleEndian(n);
    if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t(0) << (8 * n);  // sign-extend
    return static_cast<int64_t>(v);
  }
  double binFloat() {
    need(8);
    uint64_t bits = 0;
    for (size_t i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(data_[pos_ + i]);
    pos_ += 8;
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }

  // -- the stack and the memo --

  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(Item item) { stack_.push_back(std::move(item)); }
  Item& top() {
    if (stack_.size() <= floor()) failAt("pickle stack underflow");
    return stack_.back();
  }
  Item pop() {
    Item item = std::move(top());
    stack_.pop_back();
    return item;
  }
  std::vector<Item> popN(size_t n) {
    if (stack_.size() - floor() < n) failAt("pickle stack underflow");
    std::vector<Item> items(std::make_move_iterator(stack_.end() - n), std::make_move_iterator(stack_.end()));
    stack_.resize(stack_.size() - n);
    return items;
  }
  std::vector<Item> popToMark() {
    if (marks_.empty()) failAt("pickle has no MARK to pop to");
    std::vector<Item> items = popN(stack_.size() - marks_.back());
    marks_.pop_back();
    return items;
  }
  const Item& memoGet(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) failAt("pickle memo has no entry " + std::to_string(key));
    return it->second;
  }
  void memoPut(uint64_t key) { memo_[key] = top(); }

  // -- one opcode; false at STOP --

  bool step() {
    opPos_ = pos_;
    const uint8_t code = u8();
    switch (code) {
      case op::PROTO: {
        const uint8_t version = u8();
        if (version > 5) failAt("unsupported pickle protocol " + std::to_string(version));
        break;
      }
      case op::FRAME: littleEndian(8); break;
      case op::STOP: return false;
      case op::MARK: marks_.push_back(stack_.size()); break;
      case op::EMPTY_DICT: push(Item::of(newDict())); break;
      case op::EMPTY_LIST: push(Item::of(newList())); break;
      case op::EMPTY_TUPLE: push(Item::tuple({})); break;
      case op::TUPLE: push(Item::tuple(popToMark())); break;
      case op::TUPLE1: case op::TUPLE2: case op::TUPLE3: push(Item::tuple(popN(code - op::TUPLE1 + 1))); break;
      case op::SETITEM: setItems(popN(2)); break;
      case op::SETITEMS: setItems(popToMark()); break;
      case op::APPEND: appendItems(popN(1)); break;
      case op::APPENDS: appendItems(popToMark()); break;
      case op::BINPUT: memoPut(u8()); break;
      case op::LONG_BINPUT: memoPut(littleEndian(4)); break;
      case op::MEMOIZE: memoPut(memo_.size()); break;
      case op::BINGET: push(memoGet(u8())); break;
      case op::LONG_BINGET: push(memoGet(littleEndian(4))); break;
      case op::BININT: push(Item::of(int64_t(int32_t(uint32_t(littleEndian(4)))))); break;
      case op::BININT1: push(Item::of(int64_t(u8()))); break;
      case op::BININT2: push(Item::of(int64_t(littleEndian(2)))); break;
      case op::LONG1: push(Item::of(long1())); break;
      case op::BINFLOAT: push(Item::of(binFloat())); break;
      case op::NEWTRUE: push(Item::of(true)); break;
      case op::NEWFALSE: push(Item::of(false)); break;
      case op::NONE: push(Item::of(c10::IValue())); break;
      case op::BINUNICODE: push(Item::of(bytes(littleEndian(4)))); break;
      case op::SHORT_BINUNICODE: push(Item::of(bytes(u8()))); break;
      case op::BINUNICODE8: push(Item::of(bytes(littleEndian(8)))); break;
      case op::GLOBAL: {
        std::string module = line();
        pushGlobal(module + "." + line());
        break;
      }
      case op::STACK_GLOBAL: {
        std::string name = stringOf(pop());
        pushGlobal(stringOf(pop()) + "." + name);
        break;
      }
      case op::REDUCE: reduce(); break;
      case op::BUILD: build(); break;
      case op::BINPERSID: persistentLoad(); break;
      default: unsupportedOpcode(code);
    }
    return true;
  }

  [[noreturn]] void unsupportedOpcode(uint8_t code) const {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", code);
    std::string name = code >= 0x20 && code < 0x7f ? std::string(" ('") + char(code) + "')" : "";
    failAt("unsupported pickle opcode " + std::string(hex) + name);
  }

  // -- values --

  c10::IValue valueOf(const Item& item) const {
    if (item.kind == Item::Kind::Value) return item.value;
    if (item.kind != Item::Kind::Tuple) failAt("unsupported value: " + describe(item));
    std::vector<c10::IValue> elements;
    for (const Item& e : *item.elements) elements.push_back(valueOf(e));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  std::string stringOf(const Item& item) const {
    if (item.kind != Item::Kind::Value || !item.value.isString()) failAt("expected a string, got " + describe(item));
    return item.value.toStringRef();
  }
  int64_t intOf(const Item& item, const char* what) const {
    if (item.kind != Item::Kind::Value || !item.value.isInt()) failAt(std::string("expected an int for ") + what);
    return item.value.toInt();
  }
  bool boolOf(const Item& item, const char* what) const {
    if (item.kind != Item::Kind::Value || !item.value.isBool()) failAt(std::string("expected a bool for ") + what);
    return item.value.toBool();
  }
  std::vector<int64_t> intsOf(const Item& item, const char* what) const {
    if (item.kind != Item::Kind::Tuple) failAt(std::string("expected a tuple of ints for ") + what);
    std::vector<int64_t> ints;
    for (const Item& e : *item.elements) ints.push_back(intOf(e, what));
    return ints;
  }
  const std::vector<Item>& tupleOf(const Item& item, const char* what) const {
    if (item.kind != Item::Kind::Tuple) failAt(std::string("expected a tuple for ") + what + ", got " + describe(item));
    return *item.elements;
  }

  // -- containers --

  c10::impl::GenericDict newDict() {
    dicts_.emplace_back(c10::AnyType::get(), c10::AnyType::get());
    return dicts_.back();
  }
  c10::impl::GenericList newList() {
    lists_.emplace_back(c10::AnyType::get());
    return lists_.back();
  }
  void setItems(const std::vector<Item>& keysAndValues) {
    Item& target = top();
    if (target.kind != Item::Kind::Value || !target.value.isGenericDict()) failAt("SETITEM on " + describe(target));
    if (keysAndValues.size() % 2 != 0) failAt("SETITEMS with an odd number of items");
    c10::impl::GenericDict dict = target.value.toGenericDict();
    for (size_t i = 0; i < keysAndValues.size(); i += 2) {
      c10::IValue key = valueOf(keysAndValues[i]);
      if (!key.isString() && !key.isInt() && !key.isDouble() && !key.isBool()) {
        failAt("unsupported dict key: " + describe(keysAndValues[i]));
      }
      dict.insert_or_assign(std::move(key), valueOf(keysAndValues[i + 1]));
    }
  }
  void appendItems(const std::vector<Item>& items) {
    Item& target = top();
    if (target.kind != Item::Kind::Value || !target.value.isList()) failAt("APPEND to " + describe(target));
    c10::impl::GenericList list = target.value.toList();
    for (const Item& item : items) list.push_back(valueOf(item));
  }

  // Types each dict's keys and values, and each list's elements, as their
  // common kind (str, int, float, bool or Tensor), else Any.
  void refineContainerTypes() {
    for (auto& dict : dicts_) {
      std::vector<c10::IValue> keys, values;
      for (const auto& entry : dict) {
        keys.push_back(entry.key());
        values.push_back(entry.value());
      }
      dict.unsafeSetKeyType(commonType(keys, c10::StringType::get()));
      dict.unsafeSetValueType(commonType(values, c10::AnyType::get()));
    }
    for (auto& list : lists_) list.unsafeSetElementType(commonType(list.vec(), c10::AnyType::get()));
  }
  static c10::TypePtr kindOf(const c10::IValue& v) {
    if (v.isTensor()) return c10::TensorType::get();
    if (v.isString()) return c10::StringType::get();
    if (v.isInt()) return c10::IntType::get();
    if (v.isDouble()) return c10::FloatType::get();
    if (v.isBool()) return c10::BoolType::get();
    return c10::AnyType::get();
  }
  static c10::TypePtr commonType(const std::vector<c10::IValue>& values, c10::TypePtr ifEmpty) {
    if (values.empty()) return ifEmpty;
    c10::TypePtr common = kindOf(values.front());
    for (const auto& v : values) {
      if (kindOf(v)->kind() != common->kind()) return c10::AnyType::get();
    }
    return common;
  }

  // -- globals, calls, objects --

  void pushGlobal(const std::string& name) {
    if (!isKnownGlobal(name)) failAt("unsupported global '" + name + "'");
    push(Item::global(name));
  }

  void reduce() {
    Item args = pop();
    Item callable = pop();
    if (callable.kind != Item::Kind::Global) failAt("REDUCE on " + describe(callable));
    push(call(callable.name, tupleOf(args, "the arguments of REDUCE")));
  }

  Item call(const std::string& name, const std::vector<Item>& args) {
    if (name == kRebuildTensor) return Item::of(rebuildTensor(args));
    if (name == kRebuildParameter || name == kRebuildParameterWithState) return Item::of(rebuildParameter(args));
    if (name == kOrderedDict) {
      if (!args.empty()) failAt("collections.OrderedDict called with arguments");
      return Item::of(newDict());
    }
    failAt("cannot call '" + name + "'");
  }

  // BUILD sets an object's state. torch.save's pickles only use it for the
  // attributes of an OrderedDict (a state_dict()'s _metadata), which go.
  void build() {
    pop();  // the state
    const Item& target = top();
    if (target.kind != Item::Kind::Value || !target.value.isGenericDict()) failAt("BUILD of " + describe(target));
  }

  // The persistent id of a storage: ('storage', storage type, key, location, numel).
  void persistentLoad() {
    const Item pid = pop();
    const std::vector<Item>& id = tupleOf(pid, "a persistent id");
    if (id.size() != 5 || stringOf(id[0]) != "storage") failAt("unsupported persistent id");
    if (id[1].kind != Item::Kind::Global || !storageDtype(id[1].name)) {
      failAt("unsupported storage type: " + describe(id[1]));
    }
    const at::ScalarType dtype = *storageDtype(id[1].name);
    push(Item::storage(storages_.get(stringOf(id[2]), dtype, intOf(id[4], "a storage's size"))));
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
  // backward_hooks[, metadata]): a view of the storage.
  at::Tensor rebuildTensor(const std::vector<Item>& args) {
    if (args.size() != 6 && args.size() != 7) failAt("_rebuild_tensor_v2 with " + std::to_string(args.size()) + " arguments");
    if (args[0].kind != Item::Kind::Storage) failAt("_rebuild_tensor_v2 of " + describe(args[0]));
    const at::Tensor& storage = args[0].value.toTensor();
    const int64_t offset = intOf(args[1], "a tensor's storage offset");
    const std::vector<int64_t> sizes = intsOf(args[2], "a tensor's size");
    const std::vector<int64_t> strides = intsOf(args[3], "a tensor's stride");
    checkView(storage.numel(), offset, sizes, strides);
    at::Tensor tensor = at::empty({0}, storage.options());
    tensor.set_(storage.storage(), offset, sizes, strides);
    if (boolOf(args[4], "requires_grad")) tensor.requires_grad_(true);
    return tensor;
  }

  void checkView(int64_t numel, int64_t offset, const std::vector<int64_t>& sizes,
                 const std::vector<int64_t>& strides) const {
    if (sizes.size() != strides.size()) failAt("a tensor's size and stride differ in length");
    int64_t last = offset;
    bool empty = false;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] < 0 || strides[i] < 0) failAt("a tensor with a negative size or stride");
      if (sizes[i] == 0) empty = true;
      else last += (sizes[i] - 1) * strides[i];
    }
    if (offset < 0 || (!empty && last >= numel)) failAt("a tensor reaches past the end of its storage");
  }

  // _rebuild_parameter(data, requires_grad, backward_hooks[, state]).
  at::Tensor rebuildParameter(const std::vector<Item>& args) {
    if (args.size() != 3 && args.size() != 4) failAt("_rebuild_parameter with " + std::to_string(args.size()) + " arguments");
    if (args[0].kind != Item::Kind::Value || !args[0].value.isTensor()) failAt("_rebuild_parameter of " + describe(args[0]));
    at::Tensor tensor = args[0].value.toTensor().detach();
    tensor.requires_grad_(boolOf(args[1], "requires_grad"));
    return tensor;
  }

  const std::string& data_;
  size_t pos_ = 0;
  size_t opPos_ = 0;
  Storages& storages_;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;  // stack sizes at each MARK
  std::unordered_map<uint64_t, Item> memo_;
  std::vector<c10::impl::GenericDict> dicts_;
  std::vector<c10::impl::GenericList> lists_;
};

// ---- the archive ---------------------------------------------------------------

// torch.save's legacy format (_use_new_zipfile_serialization=False) is a bare
// pickle stream, not a zip file.
void rejectLegacy(char firstByte) {
  if (static_cast<uint8_t>(firstByte) == op::PROTO) {
    fail("not a zip file: this is torch.save's legacy format (_use_new_zipfile_serialization=False); "
         "save it again with torch.save's default format");
  }
}

c10::IValue readArchive(std::shared_ptr<ReadAdapterInterface> in) {
  std::unique_ptr<PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<PyTorchStreamReader>(std::move(in));
  } catch (const c10::Error& e) {
    fail("not a torch.save zip file: " + firstLine(e));
  }
  if (!reader->hasRecord("data.pkl")) fail("not a torch.save file: the archive has no data.pkl");
  if (reader->hasRecord("byteorder")) {
    at::DataPtr order;
    size_t size = 0;
    std::tie(order, size) = reader->getRecord("byteorder");
    if (std::string(static_cast<const char*>(order.get()), size) != "little") {
      fail("big-endian torch.save files are not supported");
    }
  }
  at::DataPtr data;
  size_t size = 0;
  std::tie(data, size) = reader->getRecord("data.pkl");
  const std::string pickle(static_cast<const char*>(data.get()), size);
  Storages storages(*reader);
  return Unpickler(pickle, storages).run();
}


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
  std::unordered_map<std::string, uint64_t> shared_;  // "global <name>" or "str <text>": its memo index
};

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
}  // namespace

c10::IValue loadTorchSaveBytes(const std::string& bytes) {
  try {
    if (!bytes.empty()) rejectLegacy(bytes[0]);
    return readArchive(std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), bytes.size()));
  } catch (const c10::Error& e) {
    throw Diagnostic("", "cannot read torch.save file: " + firstLine(e));
  }
}

c10::IValue loadTorchSave(const std::string& path) {
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(std::string("cannot open: ") + std::strerror(errno));
    char first = 0;
    in.get(first);
    in.clear();
    in.seekg(0);
    rejectLegacy(first);
    return readArchive(std::make_shared<caffe2::serialize::IStreamAdapter>(&in));
  } catch (Diagnostic& d) {
    throw d.inFile(path);
  } catch (const c10::Error& e) {
    throw Diagnostic("", "cannot read torch.save file: " + firstLine(e)).inFile(path);
  }
}

std::string saveTorchSave(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  const std::vector<std::pair<std::string, at::Tensor>> prepared = prepare(tensors);
  Pickler pickler;
  pickler.tensorDict(prepared);
  const std::string pickle = pickler.finish();
  std::string bytes;
  try {
    // Records in the order Python writes them; writeEndOfFile adds "version"
    // ("3\n", what LibTorch 1.13 and Python's torch.save of 1.13 write, which
    // PyTorch 2.x reads as well).
    PyTorchStreamWriter writer([&bytes](const void* data, size_t size) {
      bytes.append(static_cast<const char*>(data), size);
      return size;
    });
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    const std::string order = "little";
    writer.writeRecord("byteorder", order.data(), order.size());
    for (size_t i = 0; i < prepared.size(); ++i) {
      const at::Tensor& t = prepared[i].second;
      writer.writeRecord("data/" + std::to_string(i), t.numel() > 0 ? t.data_ptr() : nullptr, t.nbytes());
    }
    writer.writeEndOfFile();
  } catch (const c10::Error& e) {
    fail("cannot write torch.save file: " + firstLine(e));
  }
  return bytes;
}

}  // namespace spmd

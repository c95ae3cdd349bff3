// Reading torch.save's data.pkl, and torch.jit.save's (its modules as dicts of
// their attributes, for loadTorchScriptTensors): a small pickle machine of our
// own (see torch_save.cpp for why), separate from the zip archive and from the writer.
#include "torch_save_internal.h"

#include "spmd/support/limits.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace spmd {
namespace torch_save_detail {
namespace {

using caffe2::serialize::PyTorchStreamReader;

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
  int height = 0;                                     // Tuple: levels of tuples and containers in it

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

// ---- the pickle machine --------------------------------------------------------

class Unpickler {
 public:
  Unpickler(const std::string& pickle, Storages& storages, bool torchScriptObjects)
      : data_(pickle), storages_(storages), torchScriptObjects_(torchScriptObjects) {}

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
      case op::TUPLE: push(nestedTuple(popToMark())); break;
      case op::TUPLE1: case op::TUPLE2: case op::TUPLE3: push(nestedTuple(popN(code - op::TUPLE1 + 1))); break;
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
      case op::NEWOBJ: newObject(); break;
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

  // -- nesting --
  //
  // Values nest at most kMaxPickleDepth levels (valueOf and IValue's
  // destructor recurse), and a container takes no items once it is inside
  // another: that is how Python's pickler writes acyclic data, and it keeps
  // out cycles (a dict holding itself), which would make every walk of the
  // result endless.

  static constexpr int kMaxPickleDepth = 64;

  static const void* containerOf(const Item& item) {
    if (item.kind != Item::Kind::Value) return nullptr;
    if (item.value.isGenericDict() || item.value.isList()) return item.value.internalToPointer();
    return nullptr;
  }
  int heightOf(const Item& item) const {
    if (item.kind == Item::Kind::Tuple) return item.height;
    const void* c = containerOf(item);
    if (!c) return 0;
    auto it = heights_.find(c);
    return it == heights_.end() ? 1 : it->second;
  }
  // Records that `children` now sit inside a parent of the returned height.
  int nest(const std::vector<Item>& children, int height) {
    for (const Item& child : children) {
      height = std::max(height, 1 + heightOf(child));
      if (const void* c = containerOf(child)) nested_.insert(c);
    }
    if (height > kMaxPickleDepth) failAt("values nested deeper than " + std::to_string(kMaxPickleDepth) + " levels");
    return height;
  }
  Item nestedTuple(std::vector<Item> elements) {
    const int height = nest(elements, 1);
    Item item = Item::tuple(std::move(elements));
    item.height = height;
    return item;
  }
  // Before items go into the container `target`.
  void fill(const Item& target, const std::vector<Item>& items) {
    const void* c = containerOf(target);
    if (nested_.count(c)) failAt("a dict or list changed after it was put in another (a cycle?)");
    heights_[c] = nest(items, heightOf(target));
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
    fill(target, keysAndValues);
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
    fill(target, items);
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

  static bool isTorchScriptClass(const std::string& name) { return name.rfind("__torch__.", 0) == 0; }
  // What TorchScript's pickler wraps typed lists in: build_intlist([1, 2])
  // is the list, as restore_type_tag(value, "List[int]") is the value.
  static bool isTorchScriptListBuilder(const std::string& name) {
    static const std::unordered_set<std::string> builders = {
        "torch.jit._pickle.build_intlist",    "torch.jit._pickle.build_doublelist",
        "torch.jit._pickle.build_boollist",   "torch.jit._pickle.build_tensorlist",
        "torch.jit._pickle.restore_type_tag"};
    return builders.count(name) > 0;
  }

  void pushGlobal(const std::string& name) {
    const bool torchScript = isTorchScriptClass(name) || isTorchScriptListBuilder(name);
    if (!isKnownGlobal(name) && !(torchScriptObjects_ && torchScript)) {
      failAt("unsupported global '" + name + "'");
    }
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
    if (isTorchScriptListBuilder(name)) {
      if (args.empty() || args.size() > 2) failAt(name + " with " + std::to_string(args.size()) + " arguments");
      return args[0];
    }
    failAt("cannot call '" + name + "'");
  }

  // NEWOBJ: cls.__new__(cls, *args). A TorchScript object (a module) starts
  // as an empty dict, which BUILD fills with its attributes.
  void newObject() {
    const Item args = pop();
    const Item cls = pop();
    if (cls.kind != Item::Kind::Global || !isTorchScriptClass(cls.name)) failAt("NEWOBJ of " + describe(cls));
    if (!tupleOf(args, "the arguments of NEWOBJ").empty()) failAt("NEWOBJ of '" + cls.name + "' with arguments");
    Item object = Item::of(newDict());
    objects_.insert(containerOf(object));
    push(std::move(object));
  }

  // BUILD sets an object's state: a TorchScript object's attributes (a dict
  // of them). torch.save's pickles use it only for the attributes of an
  // OrderedDict (a state_dict()'s _metadata), which go.
  void build() {
    const Item state = pop();
    const Item& target = top();
    if (target.kind != Item::Kind::Value || !target.value.isGenericDict()) failAt("BUILD of " + describe(target));
    if (!objects_.count(containerOf(target))) return;
    if (state.kind != Item::Kind::Value || !state.value.isGenericDict()) failAt("BUILD with " + describe(state));
    std::vector<Item> attributes;
    for (const auto& entry : state.value.toGenericDict()) {
      attributes.push_back(Item::of(entry.key()));
      attributes.push_back(Item::of(entry.value()));
    }
    setItems(attributes);
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
    if (!boundedNumel(sizes)) failAt("a tensor with a negative size or more than 2^48 elements");
    for (int64_t stride : strides) {
      if (stride < 0) failAt("a tensor with a negative stride");
    }
    if (offset < 0) failAt("a tensor with a negative storage offset");
    if (*boundedNumel(sizes) == 0) return;
    // The last element's offset, summed without overflow: each step checks
    // that the storage still holds it.
    const auto pastEnd = [&] { failAt("a tensor reaches past the end of its storage"); };
    if (offset >= numel) pastEnd();
    int64_t last = offset;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] <= 1 || strides[i] == 0) continue;
      if (sizes[i] - 1 > (numel - 1 - last) / strides[i]) pastEnd();
      last += (sizes[i] - 1) * strides[i];
    }
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
  std::unordered_map<const void*, int> heights_;  // containers' heights, 1 when empty
  std::unordered_set<const void*> nested_;        // containers inside another
  std::vector<c10::impl::GenericDict> dicts_;
  std::vector<c10::impl::GenericList> lists_;
  const bool torchScriptObjects_;
  std::unordered_set<const void*> objects_;  // the dicts NEWOBJ made
};

}  // namespace

c10::IValue unpickle(const std::string& pickle, PyTorchStreamReader& reader, const UnpickleOptions& options) {
  Storages storages(reader, options);
  return Unpickler(pickle, storages, options.torchScriptObjects).run();
}

}  // namespace torch_save_detail
}  // namespace spmd

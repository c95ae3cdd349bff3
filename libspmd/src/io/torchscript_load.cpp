// Loading a TorchScript module, with or without its parameters' and
// buffers' values.
//
// jit::load copies every storage record into fresh heap memory. Tracing on
// the meta device reads no values, and on a VM that copy (page faults and
// zeroing, not the bytes) is most of spmd-expand's time: 2.4 s of 2.6 s for
// bench/models.py's 652 MB GPT on the 2-core CI machine. So the first load
// leaves the parameters' and buffers' records unread, and the module is used
// only with its parameters and buffers swapped for meta tensors.
#include "torchscript_internal.h"

#include "spmd/io/zip_members.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/phase_times.h"
#include "huge_pages.h"

#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <utility>

namespace spmd {
namespace torchscript_detail {
namespace {

// The storages jit::save writes for the module's attributes: <archive>/data/<key>.
// (Tensor constants of the code are <archive>/constants/<key>, read always.)
bool isAttributeStorage(const std::string& name) {
  const size_t first = name.find('/');
  return first != std::string::npos && name.compare(first + 1, 5, "data/") == 0 &&
         name.find('/', first + 6) == std::string::npos;
}

// Serves the zip from memory. With WeightValues::Skip a read of a whole
// attribute storage record copies nothing and remembers where it was to go.
class ModuleReadAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  ModuleReadAdapter(std::string_view bytes, WeightValues values) : bytes_(bytes) {
    if (values == WeightValues::Read) return;
    try {
      for (const ZipMember& m : zipMembers(bytes)) {
        if (!m.compressed && isAttributeStorage(m.name)) skippable_.emplace(m.offset, m.size);
      }
    } catch (const Diagnostic&) {
      // A damaged zip: jit::load reads it all and says what is wrong.
    }
  }

  size_t size() const override { return bytes_.size(); }

  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - pos);
    if (n > 0 && skippable_.count({pos, n})) {
      unread_.insert(buf);
      return n;
    }
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

  // Where the unread records went: the data pointers of their storages.
  const std::set<const void*>& unread() const { return unread_; }

 private:
  std::string_view bytes_;
  std::set<std::pair<uint64_t, size_t>> skippable_;  // (offset, size) of records not to read
  mutable std::set<const void*> unread_;  // read() is const in the interface
};

// Whether an unread storage is reachable from the module other than through
// a parameter or buffer slot (a plain tensor attribute, a list of tensors, a
// custom class holding one): the tracer would take its value as a constant.
// Custom class objects are opaque: they count as reaching one.
class UnreadReach {
 public:
  explicit UnreadReach(const std::set<const void*>& unread) : unread_(unread) {}

  bool fromSlots(const c10::ivalue::Object& object) {
    if (!visited_.insert(&object).second) return false;
    const c10::ClassTypePtr type = object.type();
    for (size_t i = 0; i < object.slots().size(); ++i) {
      const bool stateSlot = type->is_module() && (type->is_parameter(i) || type->is_buffer(i));
      if (stateSlot && object.getSlot(i).isTensor()) continue;
      if (from(object.getSlot(i))) return true;
    }
    return false;
  }

 private:
  bool from(const c10::IValue& v) {
    if (v.isTensor()) return v.toTensor().defined() && unread_.count(v.toTensor().storage().data()) > 0;
    if (v.isObject()) return fromSlots(*v.toObject());
    if (v.isTuple()) return anyOf(v.toTupleRef().elements());
    if (v.isList()) return anyOf(v.toListRef());
    if (v.isGenericDict()) {
      for (const auto& item : v.toGenericDict()) {
        if (from(item.key()) || from(item.value())) return true;
      }
      return false;
    }
    return v.isCapsule() || v.isFuture() || v.isRRef() || v.isPyObject();
  }
  template <typename Range>
  bool anyOf(const Range& values) {
    for (const c10::IValue& e : values) {
      if (from(e)) return true;
    }
    return false;
  }

  const std::set<const void*>& unread_;
  std::set<const c10::ivalue::Object*> visited_;
};

// The first line of a load error that says something, with the place in the
// module's code it names, if any: the TorchScript compiler's reports begin
// with an empty line and name the code's file and line further down.
std::string loadErrorLine(const std::string& what) {
  std::istringstream lines(what);
  std::string line, first, place;
  while (std::getline(lines, line)) {
    const size_t text = line.find_first_not_of(" \t");
    if (text == std::string::npos) continue;
    if (first.empty()) {
      first = line.substr(text);
    } else if (place.empty() && line.compare(text, 6, "File \"") == 0) {
      place = line.substr(text);
    }
  }
  if (first.empty()) return "no reason given";
  return place.empty() ? first : first + " (" + place + ")";
}

jit::Module importModule(std::shared_ptr<ModuleReadAdapter> adapter) {
  try {
    return jit::load(std::move(adapter));
  } catch (const c10::Error& e) {
    throw Diagnostic("", "not a loadable TorchScript module: " + loadErrorLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {  // the TorchScript compiler's ErrorReport for damaged code, say
    throw Diagnostic("", "not a loadable TorchScript module: " + loadErrorLine(e.what()));
  }
}

}  // namespace

std::optional<jit::Module> loadModule(std::string_view bytes, WeightValues values) {
  HugePageAllocations hugePages;
  if (values == WeightValues::Read) {
    TimedPhase phase("load the module (jit::load)");
    return importModule(std::make_shared<ModuleReadAdapter>(bytes, values));
  }
  TimedPhase phase("load the module without its weights (jit::load)");
  auto adapter = std::make_shared<ModuleReadAdapter>(bytes, values);
  jit::Module module = importModule(adapter);
  if (UnreadReach(adapter->unread()).fromSlots(*module._ivalue())) return std::nullopt;
  return module;
}

}  // namespace torchscript_detail
}  // namespace spmd

#include "spmd/ir/op_name.h"

#include "spmd/ops/dispatch.h"

#include <deque>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace spmd {
namespace {

// Names by id (0: none) and ids by name. A deque keeps str()'s references
// valid as it grows.
struct Table {
  std::mutex mutex;
  std::deque<std::string> names{""};
  std::unordered_map<std::string, uint32_t> ids;
};

Table& table() {
  static Table* t = new Table;  // never destroyed: OpNames may outlive static destructors
  return *t;
}

}  // namespace

OpName OpName::of(std::string_view qualified) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.ids.find(std::string(qualified));
  if (it != t.ids.end()) return OpName(it->second);
  const uint32_t id = static_cast<uint32_t>(t.names.size());
  t.names.emplace_back(qualified);
  t.ids.emplace(t.names.back(), id);
  return OpName(id);
}

OpName OpName::of(std::string_view op, std::string_view overload) {
  std::string qualified(op);
  if (!overload.empty()) qualified.append(".").append(overload);
  return of(qualified);
}

OpName OpName::known(std::string_view qualified) {
  const size_t dot = qualified.find('.');
  const std::string op(qualified.substr(0, dot));
  const std::string overload(dot == std::string_view::npos ? "" : qualified.substr(dot + 1));
  if (!findOperator(op, overload)) {
    throw std::logic_error("OpName::known: no operator '" + std::string(qualified) + "' in this LibTorch or spmd's library");
  }
  return of(qualified);
}

const std::string& OpName::str() const {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.names[id_];
}

}  // namespace spmd

#include "spmd/ir/dtype.h"

#include <utility>
#include <vector>

namespace spmd {
namespace {

struct DtypeNames {
  c10::ScalarType type;
  const char* name;
  const char* shortName;
};

const std::vector<DtypeNames>& table() {
  static const std::vector<DtypeNames> names = {
      {c10::ScalarType::Float, "float32", "f32"},
      {c10::ScalarType::Double, "float64", "f64"},
      {c10::ScalarType::Half, "float16", "f16"},
      {c10::ScalarType::BFloat16, "bfloat16", "bf16"},
      {c10::ScalarType::Long, "int64", "i64"},
      {c10::ScalarType::Int, "int32", "i32"},
      {c10::ScalarType::Short, "int16", "i16"},
      {c10::ScalarType::Char, "int8", "i8"},
      {c10::ScalarType::Byte, "uint8", "u8"},
      {c10::ScalarType::Bool, "bool", "b8"},
  };
  return names;
}

// torch's other spellings of the same dtypes.
const std::vector<std::pair<const char*, c10::ScalarType>>& aliases() {
  static const std::vector<std::pair<const char*, c10::ScalarType>> names = {
      {"float", c10::ScalarType::Float},  {"double", c10::ScalarType::Double},
      {"half", c10::ScalarType::Half},    {"long", c10::ScalarType::Long},
      {"int", c10::ScalarType::Int},      {"short", c10::ScalarType::Short},
  };
  return names;
}

}  // namespace

std::string dtypeName(c10::ScalarType t) {
  for (const auto& d : table()) {
    if (d.type == t) return d.name;
  }
  return c10::toString(t);
}

std::string dtypeShortName(c10::ScalarType t) {
  for (const auto& d : table()) {
    if (d.type == t) return d.shortName;
  }
  return c10::toString(t);
}

std::optional<c10::ScalarType> parseDtype(const std::string& name) {
  std::string n = name.rfind("torch.", 0) == 0 ? name.substr(6) : name;
  for (const auto& d : table()) {
    if (n == d.name || n == d.shortName) return d.type;
  }
  for (const auto& a : aliases()) {
    if (n == a.first) return a.second;
  }
  return std::nullopt;
}

}  // namespace spmd

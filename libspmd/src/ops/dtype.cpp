#include "spmd/ops/dtype.h"

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

// torch's other spellings of the same dtypes, and the fp16/fp32/fp64 of
// mixed-precision flags (--autocast cuda:fp16).
const std::vector<std::pair<const char*, c10::ScalarType>>& aliases() {
  static const std::vector<std::pair<const char*, c10::ScalarType>> names = {
      {"float", c10::ScalarType::Float},  {"double", c10::ScalarType::Double},
      {"half", c10::ScalarType::Half},    {"long", c10::ScalarType::Long},
      {"int", c10::ScalarType::Int},      {"short", c10::ScalarType::Short},
      {"fp16", c10::ScalarType::Half},    {"fp32", c10::ScalarType::Float},
      {"fp64", c10::ScalarType::Double},
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

namespace {

const std::vector<std::string>& layoutNames() {
  static const std::vector<std::string> names = {"strided", "sparse_coo"};  // c10::Layout order
  return names;
}

const std::vector<std::string>& memoryFormatNames() {
  static const std::vector<std::string> names = {"contiguous_format", "preserve_format", "channels_last",
                                                 "channels_last_3d"};  // c10::MemoryFormat order
  return names;
}

std::string nameAt(const std::vector<std::string>& names, int64_t i) {
  return i >= 0 && i < static_cast<int64_t>(names.size()) ? names[i] : std::to_string(i);
}

std::optional<int64_t> indexOf(const std::vector<std::string>& names, const std::string& name) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<int64_t>(i);
  }
  return std::nullopt;
}

}  // namespace

std::string layoutName(int64_t layout) { return nameAt(layoutNames(), layout); }
std::string memoryFormatName(int64_t format) { return nameAt(memoryFormatNames(), format); }
std::optional<int64_t> parseLayout(const std::string& name) { return indexOf(layoutNames(), name); }
std::optional<int64_t> parseMemoryFormat(const std::string& name) { return indexOf(memoryFormatNames(), name); }

}  // namespace spmd

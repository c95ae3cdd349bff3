#include "spmd/io/input_spec.h"

#include "spmd/ops/dtype.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/echo.h"
#include "spmd/support/limits.h"

#include <cctype>
#include <set>

namespace spmd {
namespace {

std::vector<int64_t> parseDims(const std::string& body, const std::string& where) {
  std::vector<int64_t> dims;
  if (body.empty()) return dims;  // a scalar: NAME:f32[]
  size_t pos = 0;
  while (true) {
    size_t comma = body.find(',', pos);
    std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item.empty() || item.size() > 18) {
      throw Diagnostic(where, "expected a dimension size, got '" + echo(item) + "'");
    }
    for (char c : item) {
      if (!std::isdigit(static_cast<unsigned char>(c))) {
        throw Diagnostic(where, "expected a dimension size, got '" + echo(item) + "'");
      }
    }
    dims.push_back(std::stoll(item));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return dims;
}

}  // namespace

InputSpec parseInputSpec(const std::string& text) {
  const std::string where = "--input '" + echo(text) + "'";
  size_t colon = text.find(':');
  size_t open = text.find('[');
  if (colon == std::string::npos || colon == 0) {
    throw Diagnostic(where, "expected NAME:DTYPE[d0,d1,...]");
  }
  if (open == std::string::npos || open < colon || text.back() != ']') {
    throw Diagnostic(where, "expected NAME:DTYPE[d0,d1,...]");
  }
  InputSpec spec;
  spec.name = text.substr(0, colon);
  std::string dtype = text.substr(colon + 1, open - colon - 1);
  auto parsed = parseDtype(dtype);
  if (!parsed) throw Diagnostic(where, "unknown dtype '" + echo(dtype) + "'");
  spec.dtype = *parsed;
  spec.shape = parseDims(text.substr(open + 1, text.size() - open - 2), where);
  const std::string problem = shapeBoundProblem(spec.shape);
  if (!problem.empty()) throw Diagnostic(where, "shape with " + problem);
  return spec;
}

std::vector<InputSpec> parseInputSpecs(const std::vector<std::string>& texts) {
  std::vector<InputSpec> specs;
  std::set<std::string> seen;
  for (const auto& t : texts) {
    specs.push_back(parseInputSpec(t));
    if (!seen.insert(specs.back().name).second) {
      throw Diagnostic("--input '" + echo(t) + "'", "input '" + echo(specs.back().name) + "' given twice");
    }
  }
  return specs;
}

}  // namespace spmd

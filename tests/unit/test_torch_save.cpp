// loadTorchSave reads what Python's torch.save writes. The fixtures are
// written at test time by PyTorch (SPMD_TORCH_PYTHON), with the expected
// tensors as JSON (shape, strides, offset, and the values listed exactly) so
// that the check does not go through the reader under test.
//
// saveTorchSave writes what Python's torch.load(weights_only=True) reads: its
// files are checked by PyTorch against the tensors as JSON, and against the
// pickle torch.save itself writes for the same dict.
#include "spmd/io/torch_save.h"
#include "spmd/io/zip_members.h"
#include "spmd/io/zip_writer.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/mapped_file.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

// Last: glog (via LibTorch) defines CHECK too, and Catch's must win.
#include "catch.h"

using namespace spmd;
using nlohmann::json;

namespace {

const char* const kFixtureScript = R"PY(
import collections, io, json, os, sys, zipfile
import torch

out = sys.argv[1]
torch.manual_seed(0)
expected = {}
DTYPES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
          torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
          torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool"}

def describe(t):
    return {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "stride": list(t.stride()),
            "offset": t.storage_offset(), "requires_grad": t.requires_grad,
            "values": t.detach().reshape(-1).tolist()}

def save(name, obj, tensors, **kw):
    torch.save(obj, os.path.join(out, name), **kw)
    expected[name] = {path: describe(t) for path, t in tensors.items()}

x = torch.randn(3, 4)
save("one.pt", {"x": x}, {"x": x})

multi = {"f32": torch.randn(2, 3), "f64": torch.randn(4, dtype=torch.float64),
         "f16": torch.randn(3).half(), "bf16": torch.randn(3, 2).to(torch.bfloat16),
         "i64": torch.tensor([-2**62, -1, 0, 2**40, 2**62]), "i32": torch.randint(-1000, 1000, (4,), dtype=torch.int32),
         "i16": torch.tensor([-300, 300], dtype=torch.int16), "i8": torch.tensor([-7, 7], dtype=torch.int8),
         "u8": torch.tensor([0, 255], dtype=torch.uint8), "b": torch.randn(6) > 0,
         "empty": torch.zeros(0, 3)}
save("multi.pt", multi, multi)

scalar = torch.tensor(3.25)
save("scalar.pt", scalar, {"": scalar})

base = torch.randn(4, 5)
views = {"base": base, "t": base.t(), "row": base[2], "col": base[:, 1], "step": base[1:, ::2]}
save("views.pt", views, views)

a, b, c = torch.randn(2, 2), torch.randint(0, 9, (3,)), torch.randn(1)
nested = {"inputs": {"a": a, "b": b}, "outputs": [c], "buffers": {},
          "meta": {"ints": [1, -5, 2**40, -2**62, 255, 65535, -2**31], "floats": (0.5, -1e300, 3.0),
                   "str": "h\u00e9llo", "none": None, "flag": True, "off": False, "empty_list": [],
                   "empty_tuple": (), "one_tuple": (7,), "by_int": {1: "one", 2: "two"}, "mixed": [1, "x"]}}
save("nested.pt", nested, {"inputs/a": a, "inputs/b": b, "outputs/0": c})

p, q = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2), requires_grad=False)
save("param.pt", {"p": p, "frozen": q}, {"p": p, "frozen": q})

y = torch.randn(2)
save("list1.pt", [y], {"0": y})

torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
state = model.state_dict()
save("state_dict.pt", state, dict(state))

z = torch.arange(6).reshape(2, 3)
save("proto4.pt", {"z": z, "s": "\u00e9", "zt": (z.t(),)}, {"z": z, "zt/0": z.t()}, pickle_protocol=4)

# Files the reader must reject.
data = open(os.path.join(out, "one.pt"), "rb").read()
open(os.path.join(out, "truncated.pt"), "wb").write(data[: len(data) // 2])
open(os.path.join(out, "notzip.pt"), "wb").write(b"hello, this is not a zip file\n")
torch.save(torch.device("cpu"), os.path.join(out, "device.pt"))
torch.save({"x": x}, os.path.join(out, "legacy.pt"), _use_new_zipfile_serialization=False)
class Point:
    pass
torch.save({"p": Point()}, os.path.join(out, "custom.pt"))
with zipfile.ZipFile(os.path.join(out, "one.pt")) as z1:
    names = z1.namelist()
    prefix = names[0].split("/")[0] + "/"
    pkl = z1.read(prefix + "data.pkl")
    version = z1.read(prefix + "version" if prefix + "version" in names else prefix + ".data/version")
def write_zip(name, records):
    with zipfile.ZipFile(os.path.join(out, name), "w") as zf:
        for record, content in records.items():
            zf.writestr("archive/" + record, content)
write_zip("truncated_pickle.pt", {"data.pkl": pkl[: len(pkl) // 2], "version": version})
write_zip("no_storage.pt", {"data.pkl": pkl, "version": version})
write_zip("no_pickle.pt", {"version": version})
write_zip("opcode.pt", {"data.pkl": b"\x80\x02B\x03\x00\x00\x00abc.", "version": version})

json.dump(expected, open(os.path.join(out, "expected.json"), "w"))
)PY";

// The fixtures, written once per run into a temporary folder removed at exit.
class Fixtures {
 public:
  static const Fixtures& get() {
    static Fixtures fixtures;
    return fixtures;
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  const json& expected(const std::string& file) const { return expected_.at(file); }

 private:
  Fixtures() {
    std::string pattern = (std::filesystem::temp_directory_path() / "spmd-torch-save-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    dir_ = pattern;
    std::ofstream(path("make.py")) << kFixtureScript;
    std::string command = std::string(SPMD_TORCH_PYTHON) + " " + path("make.py") + " " + dir_;
    REQUIRE(std::system(command.c_str()) == 0);
    std::ifstream in(path("expected.json"));
    expected_ = json::parse(in);
  }
  ~Fixtures() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string dir_;
  json expected_;
};

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The saved values, built from JSON in a type that holds them exactly.
at::Tensor valuesOf(const json& values, at::ScalarType dtype) {
  const int64_t n = static_cast<int64_t>(values.size());
  if (dtype == at::kBool) {
    at::Tensor t = at::empty({n}, at::kBool);
    for (int64_t i = 0; i < n; ++i) t[i] = values[i].get<bool>();
    return t;
  }
  if (c10::isFloatingType(dtype)) {
    std::vector<double> v = values.get<std::vector<double>>();
    return at::tensor(v, at::kDouble).to(dtype);
  }
  std::vector<int64_t> v = values.get<std::vector<int64_t>>();
  return at::tensor(v, at::kLong).to(dtype);
}

void checkTensor(const c10::IValue& got, const json& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.isTensor());
  const at::Tensor t = got.toTensor();
  CHECK(std::string(c10::toString(t.scalar_type())) == want["dtype"].get<std::string>());
  REQUIRE(t.sizes().vec() == want["shape"].get<std::vector<int64_t>>());
  CHECK(t.strides().vec() == want["stride"].get<std::vector<int64_t>>());
  CHECK(t.storage_offset() == want["offset"].get<int64_t>());
  CHECK(t.requires_grad() == want["requires_grad"].get<bool>());
  CHECK(t.device().is_cpu());
  at::Tensor values = valuesOf(want["values"], t.scalar_type());
  CHECK(at::equal(t.detach().reshape(-1), values));
}

c10::IValue load(const std::string& name) { return loadTorchSave(Fixtures::get().path(name)); }

// Every tensor of a {name: tensor} file, checked against the expectations.
c10::impl::GenericDict checkTensorDict(const std::string& file) {
  c10::IValue value = load(file);
  REQUIRE(value.isGenericDict());
  c10::impl::GenericDict dict = value.toGenericDict();
  const json& want = Fixtures::get().expected(file);
  CHECK(dict.size() == want.size());
  for (const auto& [name, tensor] : want.items()) {
    REQUIRE(dict.contains(name));
    checkTensor(dict.at(name), tensor, file + ": " + name);
  }
  return dict;
}

struct Caught {
  bool thrown = false;
  std::string where, message, file;
};

// What f throws, caught without Catch assertions (they must not nest).
Caught caught(const std::function<void()>& f) {
  try {
    f();
  } catch (const Diagnostic& d) {
    return {true, d.where(), d.message(), d.file()};
  }
  return {};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void checkError(const std::function<void()>& f, const std::string& part) {
  const Caught c = caught(f);
  INFO("expected a Diagnostic containing: " << part);
  INFO("got: " << c.message);
  CHECK(c.thrown);
  CHECK(c.where.empty());
  CHECK(contains(c.message, part));
}

}  // namespace

TEST_CASE("a one-element dict", "[torch_save]") {
  c10::impl::GenericDict dict = checkTensorDict("one.pt");
  CHECK(dict.keyType()->kind() == c10::TypeKind::StringType);
  CHECK(dict.valueType()->kind() == c10::TypeKind::TensorType);
  for (const auto& item : dict) CHECK(item.key().toStringRef() == "x");
}

TEST_CASE("tensors of every common dtype", "[torch_save]") {
  checkTensorDict("multi.pt");
}

TEST_CASE("a 0-dim tensor at the top level", "[torch_save]") {
  checkTensor(load("scalar.pt"), Fixtures::get().expected("scalar.pt")[""], "scalar");
}

TEST_CASE("views keep their strides and share one storage", "[torch_save]") {
  c10::impl::GenericDict dict = checkTensorDict("views.pt");
  at::Tensor base = dict.at("base").toTensor();
  for (const char* view : {"t", "row", "col", "step"}) {
    INFO(view);
    CHECK(dict.at(view).toTensor().is_alias_of(base));
  }
  CHECK_FALSE(dict.at("t").toTensor().is_contiguous());
  base.zero_();
  CHECK(dict.at("t").toTensor().abs().sum().item<double>() == 0.0);
}

TEST_CASE("nested dicts, lists and tuples of plain values", "[torch_save]") {
  c10::IValue value = load("nested.pt");
  REQUIRE(value.isGenericDict());
  auto dict = value.toGenericDict();
  const json& want = Fixtures::get().expected("nested.pt");
  auto inputs = dict.at("inputs").toGenericDict();
  checkTensor(inputs.at("a"), want["inputs/a"], "inputs/a");
  checkTensor(inputs.at("b"), want["inputs/b"], "inputs/b");
  auto outputs = dict.at("outputs").toList();
  REQUIRE(outputs.size() == 1);
  CHECK(dict.at("outputs").isTensorList());
  checkTensor(outputs.get(0), want["outputs/0"], "outputs/0");
  CHECK(dict.at("buffers").toGenericDict().empty());

  auto meta = dict.at("meta").toGenericDict();
  auto ints = meta.at("ints").toList();
  std::vector<int64_t> wantInts = {1, -5, int64_t(1) << 40, -(int64_t(1) << 62), 255, 65535, -(int64_t(1) << 31)};
  REQUIRE(ints.size() == wantInts.size());
  for (size_t i = 0; i < ints.size(); ++i) CHECK(ints.get(i).toInt() == wantInts[i]);
  auto floats = meta.at("floats").toTupleRef().elements();
  REQUIRE(floats.size() == 3);
  CHECK(floats[0].toDouble() == 0.5);
  CHECK(floats[1].toDouble() == -1e300);
  CHECK(floats[2].toDouble() == 3.0);
  CHECK(meta.at("str").toStringRef() == "h\xc3\xa9llo");
  CHECK(meta.at("none").isNone());
  CHECK(meta.at("flag").toBool());
  CHECK_FALSE(meta.at("off").toBool());
  CHECK(meta.at("empty_list").toList().empty());
  CHECK(meta.at("empty_tuple").toTupleRef().elements().empty());
  CHECK(meta.at("one_tuple").toTupleRef().elements().at(0).toInt() == 7);
  auto byInt = meta.at("by_int").toGenericDict();
  CHECK(byInt.keyType()->kind() == c10::TypeKind::IntType);
  CHECK(byInt.at(int64_t(1)).toStringRef() == "one");
  CHECK(byInt.at(int64_t(2)).toStringRef() == "two");
  auto mixed = meta.at("mixed").toList();
  CHECK(mixed.elementType()->kind() == c10::TypeKind::AnyType);
  CHECK(mixed.get(0).toInt() == 1);
  CHECK(mixed.get(1).toStringRef() == "x");
}

TEST_CASE("nn.Parameter becomes its tensor, with its requires_grad", "[torch_save]") {
  checkTensorDict("param.pt");
}

TEST_CASE("a one-element list", "[torch_save]") {
  c10::IValue value = load("list1.pt");
  REQUIRE(value.isList());
  REQUIRE(value.toList().size() == 1);
  checkTensor(value.toList().get(0), Fixtures::get().expected("list1.pt")["0"], "list1");
}

TEST_CASE("a module's state_dict(), an OrderedDict with _metadata", "[torch_save]") {
  checkTensorDict("state_dict.pt");
}

TEST_CASE("pickle protocol 4", "[torch_save]") {
  c10::IValue value = load("proto4.pt");
  const json& want = Fixtures::get().expected("proto4.pt");
  auto dict = value.toGenericDict();
  checkTensor(dict.at("z"), want["z"], "z");
  CHECK(dict.at("s").toStringRef() == "\xc3\xa9");
  const auto& zt = dict.at("zt").toTupleRef().elements().at(0);
  checkTensor(zt, want["zt/0"], "zt/0");
  CHECK(zt.toTensor().is_alias_of(dict.at("z").toTensor()));
}

TEST_CASE("from bytes as from a file", "[torch_save]") {
  c10::IValue value = loadTorchSaveBytes(readFile(Fixtures::get().path("one.pt")));
  checkTensor(value.toGenericDict().at("x"), Fixtures::get().expected("one.pt")["x"], "x");
}

TEST_CASE("bad torch.save files are diagnostics", "[torch_save]") {
  const auto& fx = Fixtures::get();
  // The zip's structure is checked before LibTorch's reader sees it (a cut
  // zip crashed that reader).
  checkError([&] { load("truncated.pt"); }, "not a zip file, or a damaged one");
  checkError([&] { load("notzip.pt"); }, "not a zip file, or a damaged one");
  checkError([&] { loadTorchSaveBytes(""); }, "not a zip file, or a damaged one");
  const std::string notZip = readFile(fx.path("notzip.pt"));
  checkError([&] { loadTorchSaveBytes(notZip); }, "not a zip file, or a damaged one");
  checkError([&] { load("legacy.pt"); }, "legacy format");
  checkError([&] { load("device.pt"); }, "unsupported global 'torch.device' at byte 2 of data.pkl");
  checkError([&] { load("custom.pt"); }, "unsupported global '__main__.Point'");
  checkError([&] { load("truncated_pickle.pt"); }, "truncated pickle");
  checkError([&] { load("no_storage.pt"); }, "missing storage record 'data/0'");
  checkError([&] { load("no_pickle.pt"); }, "no data.pkl");
  checkError([&] { load("does-not-exist.pt"); }, "cannot open: No such file or directory");
  // BINBYTES, a pickle opcode torch.save does not write.
  checkError([&] { load("opcode.pt"); }, "unsupported pickle opcode 0x42 ('B') at byte 2 of data.pkl");

  const Caught c = caught([&] { load("notzip.pt"); });
  CHECK(c.file == fx.path("notzip.pt"));
  CHECK(caught([&] { loadTorchSaveBytes(notZip); }).file.empty());
}

// ---- saveTorchSave ---------------------------------------------------------------

namespace {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Checks the files named in <dir>/expected.json with torch.load(weights_only=True):
// names in order, dtypes, shapes and values; and that torch.save of what was
// loaded pickles to the same data.pkl bytes.
const char* const kLoadScript = R"PY(
import io, json, os, sys, zipfile
import torch

out = sys.argv[1]
DTYPES = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16,
          "BFloat16": torch.bfloat16, "Long": torch.int64, "Int": torch.int32,
          "Short": torch.int16, "Char": torch.int8, "Byte": torch.uint8, "Bool": torch.bool}
failures = []
for file, tensors in json.load(open(os.path.join(out, "expected.json"))).items():
    path = os.path.join(out, file)
    try:
        d = torch.load(path, weights_only=True)
    except Exception as e:
        failures.append("%s: torch.load(weights_only=True) failed: %s" % (file, e))
        continue
    if type(d) is not dict:
        failures.append("%s: loaded a %s, not a dict" % (file, type(d).__name__))
        continue
    if list(d) != [t["name"] for t in tensors]:
        failures.append("%s: names %r" % (file, list(d)[:10]))
        continue
    for want in tensors:
        name, t = want["name"], d[want["name"]]
        if not isinstance(t, torch.Tensor):
            failures.append("%s: %s is a %s" % (file, name, type(t).__name__))
        elif t.dtype != DTYPES[want["dtype"]] or list(t.shape) != want["shape"] or t.requires_grad:
            failures.append("%s: %s is %s %s requires_grad=%s" % (file, name, t.dtype, list(t.shape), t.requires_grad))
        elif t.reshape(-1).tolist() != want["values"]:
            failures.append("%s: %s has values %s" % (file, name, t.reshape(-1).tolist()[:10]))
    with zipfile.ZipFile(path) as ours:
        pkl = ours.read(ours.namelist()[0].split("/")[0] + "/data.pkl")
    buf = io.BytesIO()
    torch.save(d, buf)
    with zipfile.ZipFile(buf) as theirs:
        python_pkl = theirs.read(theirs.namelist()[0].split("/")[0] + "/data.pkl")
    if pkl != python_pkl:
        failures.append("%s: data.pkl differs from what torch.save writes" % file)
for f in failures:
    print(f, file=sys.stderr)
sys.exit(1 if failures else 0)
)PY";

// A temporary folder, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "spmd-torch-save-out-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    dir_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// A tensor as the load script expects it: dtype, shape and the values in
// row-major order, exactly.
json describeTensor(const std::string& name, const at::Tensor& t) {
  json values = json::array();
  const at::Tensor flat = t.contiguous().reshape(-1);
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (t.scalar_type() == at::kBool) values.push_back(flat[i].item<bool>());
    else if (c10::isFloatingType(t.scalar_type())) values.push_back(flat[i].item<double>());
    else values.push_back(flat[i].item<int64_t>());
  }
  return {{"name", name}, {"dtype", c10::toString(t.scalar_type())}, {"shape", t.sizes().vec()}, {"values", values}};
}

NamedTensors oneTensor() { return {{"x", at::arange(12, at::kFloat).reshape({3, 4}) * 0.25}}; }

// Every dtype saveTorchSave writes, a 0-dim tensor, an empty one, and tensors
// that are not contiguous or start inside their storage.
NamedTensors manyDtypes() {
  return {
      {"f32.t", at::arange(6, at::kFloat).reshape({3, 2}).t() - 2.5},
      {"f64", at::arange(4, at::kDouble) / 3},
      {"f16", (at::arange(-3, 3, at::kFloat) * 0.25).to(at::kHalf)},
      {"bf16", (at::arange(6, at::kFloat) * 0.5).reshape({3, 2}).to(at::kBFloat16)},
      {"i64", at::tensor(std::vector<int64_t>{-(int64_t(1) << 62), -1, 0, int64_t(1) << 40, int64_t(1) << 62})},
      {"i32", at::tensor(std::vector<int32_t>{INT32_MIN, 7, INT32_MAX})},
      {"i16", at::tensor(std::vector<int64_t>{-300, 300}).to(at::kShort)},
      {"i8", at::tensor(std::vector<int64_t>{-128, 127}).to(at::kChar)},
      {"u8", at::tensor(std::vector<int64_t>{0, 255}).to(at::kByte)},
      {"b", at::tensor(std::vector<int64_t>{1, 0, 1}).to(at::kBool)},
      {"scalar", at::scalar_tensor(3.25, at::kFloat)},
      {"empty", at::zeros({0, 3})},
      {"slice", at::arange(10, at::kLong).slice(0, 3, 7)},
      {"big", at::arange(70000, at::kInt).to(at::kByte)},
      {"h\xc3\xa9llo.weight", at::ones({2, 1, 2})},
  };
}

// More entries than one SETITEMS batch (1000) and one-byte memo indices.
NamedTensors manyEntries(int n = 1001) {
  NamedTensors tensors;
  for (int i = 0; i < n; ++i) tensors.emplace_back("layer" + std::to_string(i), at::full({2}, i, at::kLong));
  return tensors;
}

void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  REQUIRE(out.good());
}

void checkRoundTrip(const NamedTensors& tensors) {
  c10::IValue value = loadTorchSaveBytes(saveTorchSave(tensors));
  REQUIRE(value.isGenericDict());
  c10::impl::GenericDict dict = value.toGenericDict();
  REQUIRE(dict.size() == tensors.size());
  size_t i = 0;
  for (const auto& entry : dict) {
    const auto& [name, want] = tensors[i++];
    INFO(name);
    CHECK(entry.key().toStringRef() == name);
    const at::Tensor got = entry.value().toTensor();
    CHECK(got.scalar_type() == want.scalar_type());
    CHECK(got.sizes() == want.sizes());
    CHECK(got.is_contiguous());
    CHECK(got.storage_offset() == 0);
    CHECK_FALSE(got.requires_grad());
    CHECK(at::equal(got, want));
  }
}

}  // namespace

TEST_CASE("saveTorchSave round-trips through loadTorchSaveBytes", "[torch_save]") {
  checkRoundTrip(oneTensor());
  checkRoundTrip(manyDtypes());
  checkRoundTrip(manyEntries());
  checkRoundTrip(manyEntries(2000));
  checkRoundTrip({});
  at::Tensor param = at::ones({2, 2}).requires_grad_(true);
  checkRoundTrip({{"p", param}});
}

TEST_CASE("saveTorchSave's files load in PyTorch with weights_only=True", "[torch_save]") {
  TempDir dir;
  const std::vector<std::pair<std::string, NamedTensors>> files = {
      {"one.pt", oneTensor()}, {"multi.pt", manyDtypes()}, {"many.pt", manyEntries()},
      {"batches.pt", manyEntries(2000)}, {"two.pt", manyEntries(2)}, {"empty.pt", {}}};
  json expected = json::object();
  for (const auto& [file, tensors] : files) {
    writeBytes(dir.path(file), saveTorchSave(tensors));
    json described = json::array();
    for (const auto& [name, t] : tensors) described.push_back(describeTensor(name, t));
    expected[file] = described;
  }
  std::ofstream(dir.path("expected.json")) << expected.dump();
  std::ofstream(dir.path("check.py")) << kLoadScript;
  const std::string command = std::string(SPMD_TORCH_PYTHON) + " " + dir.path("check.py") + " " + dir.dir();
  CHECK(std::system(command.c_str()) == 0);
}

TEST_CASE("saveTorchSave rejects what it cannot write", "[torch_save]") {
  checkError([] { saveTorchSave({{"c", at::ones({2}, at::kComplexFloat)}}); },
             "cannot save tensor 'c': unsupported dtype ComplexFloat");
  checkError([] { saveTorchSave({{"a", at::ones({1})}, {"a", at::ones({1})}}); },
             "cannot save tensor 'a': the name is given twice");
  checkError([] { saveTorchSave({{"u", at::Tensor()}}); }, "cannot save tensor 'u': it is undefined");
}

// ---- saveTorchSaveValue: nested objects (an optimizer's state_dict) -------------

TEST_CASE("saveTorchSaveValue: nested dicts, lists, tuples and scalars read back", "[torch_save]") {
  c10::impl::GenericDict entry(c10::StringType::get(), c10::AnyType::get());
  entry.insert("step", at::scalar_tensor(3.0));
  entry.insert("exp_avg", at::arange(6, at::kFloat).reshape({2, 3}).t());  // not contiguous: saved as a copy
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  state.insert(int64_t{0}, entry);
  state.insert(int64_t{300}, c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  c10::impl::GenericList params(c10::IntType::get());
  for (int64_t i = 0; i < 1002; ++i) params.push_back(i);  // more than one SETITEMS/APPENDS batch
  c10::impl::GenericDict group(c10::StringType::get(), c10::AnyType::get());
  group.insert("lr", 0.125);
  group.insert("betas", c10::ivalue::Tuple::create({0.9, 0.95}));
  group.insert("amsgrad", false);
  group.insert("foreach", c10::IValue());
  group.insert("name", std::string("decay"));
  group.insert("params", params);
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(group);
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("state", state);
  top.insert("param_groups", groups);

  const c10::IValue back = loadTorchSaveBytes(saveTorchSaveValue(top));
  const auto readState = back.toGenericDict().at("state").toGenericDict();
  REQUIRE(readState.size() == 2);
  const auto readEntry = readState.at(int64_t{0}).toGenericDict();
  CHECK(at::equal(readEntry.at("step").toTensor(), at::scalar_tensor(3.0)));
  CHECK(at::equal(readEntry.at("exp_avg").toTensor(), at::arange(6, at::kFloat).reshape({2, 3}).t()));
  CHECK(readState.at(int64_t{300}).toGenericDict().empty());
  const auto readGroup = back.toGenericDict().at("param_groups").toListRef().at(0).toGenericDict();
  CHECK(readGroup.at("lr").toDouble() == 0.125);
  const auto betas = readGroup.at("betas").toTupleRef().elements();
  CHECK((betas.size() == 2 && betas[0].toDouble() == 0.9 && betas[1].toDouble() == 0.95));
  CHECK(readGroup.at("amsgrad").toBool() == false);
  CHECK(readGroup.at("foreach").isNone());
  CHECK(readGroup.at("name").toStringRef() == "decay");
  const auto readParams = readGroup.at("params").toListRef();
  REQUIRE(readParams.size() == 1002);
  CHECK(readParams[1001].toInt() == 1001);
}

TEST_CASE("saveTorchSaveValue refuses what torch.save's state dicts do not hold", "[torch_save]") {
  checkError([] { saveTorchSaveValue(c10::IValue(c10::complex<double>(1, 2))); }, "cannot save a ComplexDouble");
}

// ---- ZipWriter: the zip files spmd writes (artifacts, torch.save files) ---------

namespace {

const char* kZipCheckScript = R"PY(
import json, sys, zipfile
path, expected = sys.argv[1], json.load(open(sys.argv[2]))
with zipfile.ZipFile(path) as z:
    bad = z.testzip()  # reads every member and checks its CRC-32
    assert bad is None, "bad CRC-32: " + bad
    got = {i.filename: z.read(i).hex() for i in z.infolist()}
assert got == expected, sorted(set(got.items()) ^ set(expected.items()))[:4]
)PY";

}  // namespace

TEST_CASE("ZipWriter's zips read back in LibTorch, zip_members and Python's zipfile", "[zip]") {
  TempDir dir;
  std::ofstream(dir.path("check.py")) << kZipCheckScript;
  const at::Tensor big = at::randint(0, 256, {3 << 20}, at::kByte);  // pieces of 1 MiB, and a part
  const std::vector<std::pair<std::string, std::string>> records = {
      {"a.json", "{}"}, {"empty", ""}, {"odd", "seven b"},
      {"big", std::string(static_cast<const char*>(big.data_ptr()), big.nbytes())}};
  for (const bool zip64 : {false, true}) {
    INFO((zip64 ? "with" : "without") << " zip64 fields");
    const std::string path = dir.path(zip64 ? "64.zip" : "32.zip");
    {
      std::ofstream out(path, std::ios::binary);
      ZipWriter writer([&](const void* data, size_t size) { out.write(static_cast<const char*>(data), size); }, zip64);
      for (const auto& [name, bytes] : records) writer.add(name, bytes.data(), bytes.size());
      writer.finish();
    }
    json expected = json::object();
    expected["archive/version"] = "330a";  // "3\n"
    caffe2::serialize::PyTorchStreamReader reader(path);
    const auto mapping = std::make_shared<MappedFile>(path);
    const std::vector<ZipMember> members = zipMembers(*mapping);
    REQUIRE(members.size() == records.size() + 1);
    for (size_t i = 0; i < records.size(); ++i) {
      const auto& [name, bytes] = records[i];
      auto [data, size] = reader.getRecord(name);
      CHECK(std::string(static_cast<const char*>(data.get()), size) == bytes);
      CHECK(reader.getRecordOffset(name) % 64 == 0);
      CHECK(members[i].name == "archive/" + name);
      CHECK(members[i].offset == reader.getRecordOffset(name));
      CHECK(members[i].size == bytes.size());
      std::string hex;
      for (unsigned char c : bytes) hex += "0123456789abcdef"[c >> 4], hex += "0123456789abcdef"[c & 15];
      expected["archive/" + name] = hex;
    }
    std::ofstream(dir.path("expected.json")) << expected.dump();
    const std::string command = std::string(SPMD_TORCH_PYTHON) + " " + dir.path("check.py") + " " + path + " " +
                                dir.path("expected.json");
    CHECK(std::system(command.c_str()) == 0);
  }
}

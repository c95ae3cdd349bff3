// loadTorchScriptTensors reads a TorchScript module's weights as views of
// the mapped file; LibTorch's own loader (torch::jit::load, named_parameters
// and named_buffers) is the oracle. The modules are written at test time by
// PyTorch (SPMD_TORCH_PYTHON), beside the repository's samples.
#include "spmd/io/torch_save.h"
#include "spmd/io/weights.h"
#include "spmd/support/diagnostic.h"

#include <torch/script.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

// Last: glog (via LibTorch) defines CHECK too, and Catch's must win.
#include "catch.h"

using namespace spmd;

namespace {

// Modules whose weights are laid out in ways a reader can get wrong: a
// weight tied to another (one storage), a buffer that is a strided view, bool
// and int64 buffers, ModuleList and ModuleDict children, a plain tensor
// attribute, a traced module; and one whose class has __setstate__, which
// our reader leaves to jit::load.
const char* const kModuleScript = R"PY(
import sys, torch, torchvision
from typing import Tuple
out = sys.argv[1]
torch.manual_seed(0)

class Odd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)])
        self.named = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 2)})
        self.register_buffer("strided", torch.arange(12.0).reshape(3, 4).t())
        self.register_buffer("mask", torch.tensor([True, False, True]))
        self.register_buffer("steps", torch.tensor(7, dtype=torch.int64))
        self.plain = torch.randn(2)
    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h).sum() + self.named["a"](h).sum() + self.strided.sum() + self.plain.sum()

class Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 3))
    def forward(self, x):
        return x @ self.w
    @torch.jit.export
    def __getstate__(self):
        return (self.w, self.training)
    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]):
        self.w = state[0]
        self.training = state[1]

torch.jit.script(Odd()).save(out + "/odd.pt")
torch.jit.trace(torchvision.models.resnet18(num_classes=10).eval(), torch.randn(1, 3, 32, 32)).save(out + "/resnet18.pt")
torch.jit.script(Stateful()).save(out + "/stateful.pt")
)PY";

class Modules {
 public:
  static const Modules& get() {
    static Modules modules;
    return modules;
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  Modules() {
    std::string pattern = (std::filesystem::temp_directory_path() / "spmd-weights-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    dir_ = pattern;
    std::ofstream(path("make.py")) << kModuleScript;
    const std::string command = std::string(SPMD_TORCH_PYTHON) + " " + path("make.py") + " " + dir_;
    REQUIRE(std::system(command.c_str()) == 0);
  }
  ~Modules() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::string dir_;
};

std::string sample(const std::string& name) { return std::string(SPMD_SOURCE_DIR) + "/samples/" + name; }

// jit::load's parameters and buffers, the names spmd-expand gives graph inputs.
std::map<std::string, at::Tensor> oracle(const std::string& path) {
  torch::jit::Module module = torch::jit::load(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& p : module.named_parameters(true)) out.emplace(p.name, p.value);
  for (const auto& b : module.named_buffers(true)) out.emplace(b.name, b.value);
  return out;
}

void checkSame(const std::map<std::string, at::Tensor>& got, const std::map<std::string, at::Tensor>& want) {
  REQUIRE(!want.empty());
  for (const auto& [name, expected] : want) {
    INFO(name);
    auto it = got.find(name);
    REQUIRE(it != got.end());
    CHECK(it->second.scalar_type() == expected.scalar_type());
    CHECK(it->second.sizes() == expected.sizes());
    CHECK(at::equal(it->second, expected));
  }
}

void checkModule(const std::string& path) {
  INFO(path);
  checkSame(loadTorchScriptTensors(path), oracle(path));
  WeightsRef ref;
  ref.file = path;
  ref.format = "torchscript";
  checkSame(loadWeights(ref), oracle(path));
}

}  // namespace

TEST_CASE("TorchScript weights read as views equal jit::load's: samples", "[weights]") {
  for (const char* name : {"mlp.pt", "lm.pt", "cnn.pt"}) checkModule(sample(name));
}

TEST_CASE("TorchScript weights: tied, strided, bool and int buffers, module lists and dicts", "[weights]") {
  checkModule(Modules::get().path("odd.pt"));
  const auto tensors = loadTorchScriptTensors(Modules::get().path("odd.pt"));
  // One storage for the tied weight, as in the module.
  CHECK(tensors.at("head.weight").data_ptr() == tensors.at("embed.weight").data_ptr());
  CHECK(tensors.at("strided").strides() == c10::IntArrayRef({1, 4}));
  CHECK(tensors.count("plain") == 1);  // a plain tensor attribute is there too
}

TEST_CASE("TorchScript weights: a traced torchvision resnet18", "[weights]") {
  checkModule(Modules::get().path("resnet18.pt"));
}

TEST_CASE("TorchScript weights: a class with __setstate__ goes to jit::load", "[weights]") {
  const std::string path = Modules::get().path("stateful.pt");
  bool refused = false;
  try {
    loadTorchScriptTensors(path);
  } catch (const Diagnostic& d) {
    refused = d.message().find("__setstate__") != std::string::npos && d.file() == path;
  }
  CHECK(refused);
  WeightsRef ref;
  ref.file = path;
  ref.format = "torchscript";
  checkSame(loadWeights(ref), oracle(path));
}

TEST_CASE("TorchScript weights: written to, the file stays as it was", "[weights]") {
  const std::string path = Modules::get().path("odd.pt");
  auto tensors = loadTorchScriptTensors(path);
  tensors.at("blocks.0.weight").detach().fill_(42);
  CHECK(at::equal(loadTorchScriptTensors(path).at("blocks.0.weight"), oracle(path).at("blocks.0.weight")));
  CHECK(!at::equal(tensors.at("blocks.0.weight"), oracle(path).at("blocks.0.weight")));
}

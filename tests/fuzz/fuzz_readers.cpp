// A bounded, deterministic mutation fuzzer over spmd's readers (issue #19):
// the JSON graph dump (read and verified, as every tool does), the artifact,
// a file as the tools read it (artifact or TorchScript module, told from its
// content), torch.export programs (.pt2, both layouts) and their weights, torch.save files, --input specs, --data's NumPy files and a
// checkpoint's manifest.json, model.pt and optimizer.pt as --resume reads them. Each target's seeds come
// from tests/fuzz/ (the artifact's are lowered here from the JSON seeds;
// the module is samples/lm.pt); zip seeds are first cut short at
// kTruncations lengths each (issue 44: cut zips crashed LibTorch's reader),
// then every round mutates a seed with a fixed-seed generator and feeds it
// to the reader. One target is enumerated, not mutated: samples/lm.pt with
// each member in turn cut short inside a whole zip (CRCs valid), lowered
// and placed as spmd-lower and spmd-run do (issue 57: a cut storage record
// crashed them). The bar: every input is read or refused with a Diagnostic whose
// message is one line; anything else thrown, a signal, or an input that takes
// longer than --slow-ms fails the run. Before each input runs it is written
// to --crash-file, so that a crash leaves its reproducer behind.
//
//   spmd-fuzz-readers CORPUS_DIR [--rounds N] [--seed S] [--slow-ms MS] [--crash-file PATH]
//
// Run from the repository root (the JSON seeds name their weights by a
// relative path).
#include "spmd/io/artifact.h"
#include "spmd/io/exported_program.h"
#include "spmd/io/input_spec.h"
#include "spmd/io/load.h"
#include "spmd/io/torch_save.h"
#include "spmd/io/zip_writer.h"
#include "spmd/ir/verify.h"
#include "spmd/pipelines/lower.h"
#include "spmd/runtime/checkpoint.h"
#include "spmd/runtime/data_files.h"
#include "spmd/runtime/run_state.h"
#include "spmd/support/diagnostic.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using Bytes = std::string;

struct Options {
  std::string corpus;
  int rounds = 2000;
  unsigned seed = 19;
  int slowMs = 5000;
  std::string crashFile = "fuzz-current-input.bin";
};

Bytes readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<Bytes> filesIn(const fs::path& dir) {
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir)) paths.push_back(e.path());
  std::sort(paths.begin(), paths.end());  // a fixed order: runs repeat
  std::vector<Bytes> out;
  for (const auto& p : paths) out.push_back(readFile(p));
  return out;
}

// Tokens that reach the readers' corners: structure, escapes, numbers at and
// beyond the bounds, names the schema knows.
const std::vector<Bytes>& dictionary() {
  static const std::vector<Bytes> words = {
      "[", "]", "{", "}", "\"", "\\", ",", ":", "null", "true", "-", "0", "-1", "1e999", "-1e999", "1e308",
      "99999999999999999999", "9223372036854775807", "18446744073709551615", "4294967296", "2.5e-324", "\"inf\"",
      "\"nan\"", "{\"value\": \"x\"}", "{\"int\": 1}", "{\"ints\": [99999999999, 99999999999]}",
      "{\"none\": null}", "\"shape\": [99999999999,99999999999]", "\"shape\": [-1]", "\"dtype\": \"bool\"",
      "\"kind\": \"state\"", "\"iters\": 3", "\"\\u0000\"", "\"\\ud800\"", "\n", "\xff", "\x80",
      Bytes(70, '['), Bytes(70, '{'), Bytes(300, 'a'), "PK\x03\x04", "f32", "i64", "[1,2]", "[]", "x:f32[",
  };
  return words;
}

// One random edit of `data`, from the generator `rng`.
void mutateOnce(Bytes& data, std::mt19937& rng, const std::vector<Bytes>& seeds) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  const size_t at = pick(data.size() + 1);
  switch (pick(8)) {
    case 0:  // flip a bit
      if (!data.empty()) data[pick(data.size())] ^= static_cast<char>(1u << pick(8));
      break;
    case 1:  // set a byte
      if (!data.empty()) data[pick(data.size())] = static_cast<char>(pick(256));
      break;
    case 2:  // delete a run
      data.erase(at, 1 + pick(16));
      break;
    case 3:  // insert a dictionary word
      data.insert(at, dictionary()[pick(dictionary().size())]);
      break;
    case 4: {  // duplicate a run somewhere else
      const Bytes run = data.substr(pick(data.size() + 1), 1 + pick(64));
      data.insert(pick(data.size() + 1), run);
      break;
    }
    case 5:  // truncate
      data.resize(at);
      break;
    case 6: {  // splice in part of another seed
      const Bytes& other = seeds[pick(seeds.size())];
      data.replace(at, pick(64), other.substr(pick(other.size() + 1), 1 + pick(256)));
      break;
    }
    default: {  // replace a digit run by a number at a bound
      const size_t d = data.find_first_of("0123456789", at);
      if (d == Bytes::npos) break;
      const size_t end = data.find_first_not_of("0123456789", d);
      static const char* numbers[] = {"0", "99999999999", "281474976710657", "9223372036854775808", "-3", "1e999"};
      data.replace(d, (end == Bytes::npos ? data.size() : end) - d, numbers[pick(6)]);
    }
  }
}

Bytes mutate(const std::vector<Bytes>& seeds, std::mt19937& rng) {
  Bytes data = seeds[std::uniform_int_distribution<size_t>(0, seeds.size() - 1)(rng)];
  const int edits = std::uniform_int_distribution<int>(1, 4)(rng);
  for (int i = 0; i < edits; ++i) mutateOnce(data, rng, seeds);
  return data;
}

// The outcome of one input: "" when it met the bar, else what went wrong;
// `accepted` tells a read input from a refused one.
std::string runOne(const std::function<void(const Bytes&)>& reader, const Bytes& input, bool& accepted) {
  accepted = false;
  try {
    reader(input);
    accepted = true;
    return "";
  } catch (const spmd::Diagnostic& d) {
    const std::string line = d.format();
    if (line.empty()) return "an empty Diagnostic";
    if (line.find('\n') != std::string::npos) return "a Diagnostic of several lines: " + line.substr(0, 300);
    if (line.size() > 1000) return "a Diagnostic of " + std::to_string(line.size()) + " characters";
    return "";
  } catch (const std::exception& e) {
    return std::string("an exception that is no Diagnostic: ") + std::string(e.what()).substr(0, 300);
  }
}

// Seeds must be read whole: a seed refused by mistake fuzzes nothing.
std::string seedProblem(const std::function<void(const Bytes&)>& reader, const Bytes& input) {
  try {
    reader(input);
    return "";
  } catch (const std::exception& e) {
    return std::string("a seed is refused: ") + std::string(e.what()).substr(0, 300);
  }
}

struct Target {
  std::string name;
  std::vector<Bytes> seeds;
  std::function<void(const Bytes&)> reader;
  bool truncations = false;  // first, each seed cut at kTruncations evenly spaced lengths
  // The inputs are the seeds alone, each held to the bar (it may be refused),
  // not mutated.
  bool enumerated = false;
};

// A file cut short (a copy or download that stopped) is the damage a zip
// meets most; every seed is tried at this many lengths before the random rounds.
constexpr int kTruncations = 97;

// Input `round` of target `t`: its seeds, then (for zips) the seeds cut
// short, then random mutations.
Bytes inputFor(const Target& t, int round, std::mt19937& rng) {
  const int seeds = static_cast<int>(t.seeds.size());
  if (round < seeds) return t.seeds[round];
  const int cut = round - seeds;
  if (t.truncations && cut < seeds * kTruncations) {
    const Bytes& seed = t.seeds[cut / kTruncations];
    return seed.substr(0, seed.size() * (cut % kTruncations + 1) / (kTruncations + 1));
  }
  return mutate(t.seeds, rng);
}

// Reads a graph as the tools do (kind from content), then verifies it.
void readAndVerify(const Bytes& bytes) {
  spmd::LoadedGraph loaded = spmd::loadGraphFrom(bytes, "fuzz", {});
  auto problems = spmd::verifyGraph(loaded.graph);
  for (const auto& p : problems) {
    spmd::Diagnostic d(p.where, p.what);
    d.inFile("fuzz");
    if (d.format().find('\n') != std::string::npos) throw std::runtime_error("a verifier problem of several lines");
  }
}

// The artifact's bytes as spmd-lower writes them (to a file).
Bytes artifactBytes(const spmd::Artifact& artifact) {
  const fs::path path = fs::temp_directory_path() / ("spmd-fuzz-seed-" + std::to_string(::getpid()) + ".spmd");
  spmd::writeArtifact(artifact, path.string());
  Bytes bytes = readFile(path);
  fs::remove(path);
  return bytes;
}

std::vector<Bytes> artifactSeeds(const std::vector<Bytes>& jsonSeeds) {
  std::vector<Bytes> out;
  for (const Bytes& json : jsonSeeds) {
    spmd::LoadedGraph loaded = spmd::loadGraphFrom(json, "seed", {});
    out.push_back(artifactBytes(spmd::artifactOf(loaded, "cpu")));
  }
  return out;
}

// The artifacts and the sample LM's TorchScript module (samples/, from the
// repository root; read with its --input specs).
std::vector<Bytes> modulesAndArtifacts(const std::vector<Bytes>& jsonSeeds) {
  std::vector<Bytes> out = artifactSeeds(jsonSeeds);
  out.push_back(readFile("samples/lm.pt"));
  return out;
}

std::vector<Bytes> lines(const Bytes& text) {
  std::vector<Bytes> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

// A module's records (LibTorch's reader inflates the deflated code) by name,
// in the archive's order, without the version record ZipWriter writes
// (LibTorch reads .data/version first).
std::vector<std::pair<std::string, Bytes>> recordsOf(const Bytes& module) {
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(module.data(), module.size()));
  std::vector<std::pair<std::string, Bytes>> records;
  for (const std::string& name : reader.getAllRecords()) {
    if (name == "version") continue;
    auto [data, size] = reader.getRecord(name);
    records.emplace_back(name, Bytes(static_cast<const char*>(data.get()), size));
  }
  return records;
}

// The records as a zip in PyTorch's layout, record `cut` holding only its
// first `length` bytes: a whole zip, CRCs valid, one member shorter than
// what refers to it.
Bytes zipWithRecordCut(const std::vector<std::pair<std::string, Bytes>>& records, size_t cut, size_t length) {
  Bytes out;
  spmd::ZipWriter writer([&out](const void* data, size_t size) { out.append(static_cast<const char*>(data), size); });
  for (size_t i = 0; i < records.size(); ++i) {
    const Bytes& data = records[i].second;
    writer.add(records[i].first, data.data(), i == cut ? length : data.size());
  }
  writer.finish();
  return out;
}

// The module rewritten whole (read whole, as a seed), then with each record
// cut to nothing, one byte, half and all but its last byte.
std::vector<Bytes> modulesWithMembersCut(const Bytes& module) {
  const auto records = recordsOf(module);
  std::vector<Bytes> out = {zipWithRecordCut(records, records.size(), 0)};
  for (size_t i = 0; i < records.size(); ++i) {
    const size_t size = records[i].second.size();
    std::vector<size_t> lengths = {0, 1, size / 2, size - 1};
    lengths.erase(std::remove_if(lengths.begin(), lengths.end(), [size](size_t n) { return n >= size; }), lengths.end());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    for (size_t n : lengths) out.push_back(zipWithRecordCut(records, i, n));
  }
  return out;
}

// A module file as spmd-lower and spmd-run take one: read (its weights
// through the file's mapping), lowered for the CPU, its state placed.
void lowerAndPlace(const Bytes& b, const std::string& path) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
  spmd::LoadedGraph loaded =
      spmd::loadGraph(path, spmd::parseInputSpecs({"tokens:i64[4,16]", "targets:i64[4,16]"}));
  const spmd::Artifact artifact = spmd::artifactOf(loaded, "cpu");
  (void)spmd::placeState(artifact, at::Device(at::kCPU), /*rank=*/0);
}

// --data as spmd-run reads it: the bytes written as a file (a folder of one
// .npy, or a .npz), opened, and every tensor's data read, which a header
// that claims more than the file holds would turn into SIGBUS.
void readDataFile(const Bytes& b, const std::string& name) {
  static const fs::path dir = fs::temp_directory_path() / ("spmd-fuzz-data-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << b;
  const std::string path = name.size() > 4 && name.substr(name.size() - 4) == ".npz" ? (dir / name).string()
                                                                                       : dir.string();
  for (const auto& [input, tensor] : spmd::openDataTensors(path)) (void)tensor.clone();
}

// A checkpoint of the training step in json/step.json, as spmd-run writes
// it, whose members are swapped for fuzzed bytes one at a time: resuming
// reads the folder (manifest against the files, CRCs, tensors) and puts
// every value into the step's state, as spmd-run --resume does.
class CheckpointFuzz {
 public:
  explicit CheckpointFuzz(const fs::path& stepJson)
      : loaded_(spmd::loadGraphFrom(readFile(stepJson), stepJson.string(), {})),
        artifact_(spmd::artifactOf(loaded_, "cpu")),
        state_(spmd::placeState(artifact_, at::Device(at::kCPU), /*rank=*/0)),
        root_(fs::temp_directory_path() / ("spmd-fuzz-checkpoint-" + std::to_string(::getpid()))) {
    fs::remove_all(root_);
    spmd::CheckpointInfo info;  // step 0: the state is the artifact's, before any step
    info.fingerprint = spmd::stepFingerprint(artifact_);
    info.lr = 0.01;
    spmd::CheckpointWriter(root_.string(), 1).write(graph(), state_, info);
    folder_ = root_ / "step-00000000";
    for (const char* member : {"manifest.json", "model.pt", "optimizer.pt", "extra.pt"}) {
      members_[member] = readFile(folder_ / member);
    }
  }
  ~CheckpointFuzz() { fs::remove_all(root_); }

  const Bytes& member(const std::string& name) const { return members_.at(name); }

  // Resumes from the checkpoint with `member` replaced by `bytes`.
  void resume(const std::string& member, const Bytes& bytes) const {
    for (const auto& [name, seed] : members_) std::ofstream(folder_ / name, std::ios::binary) << (name == member ? bytes : seed);
    const spmd::Checkpoint c = spmd::readCheckpoint(graph(), root_.string(), /*weightsOnly=*/false);
    spmd::TensorMap state = state_;
    spmd::restoreState(graph(), c, /*weightsOnly=*/false, /*rank=*/0, state);
  }

 private:
  const spmd::Graph& graph() const { return artifact_.graph; }

  spmd::LoadedGraph loaded_;
  spmd::Artifact artifact_;
  spmd::TensorMap state_;
  fs::path root_, folder_;
  std::map<std::string, Bytes> members_;
};

Target checkpointTarget(const std::shared_ptr<CheckpointFuzz>& c, const std::string& member) {
  const bool zip = member != "manifest.json";
  return {"checkpoint " + member, {c->member(member)}, [c, member](const Bytes& b) { c->resume(member, b); }, zip};
}

std::vector<Target> targets(const Options& o) {
  const fs::path dir(o.corpus);
  const std::vector<Bytes> json = filesIn(dir / "json");
  const auto checkpoint = std::make_shared<CheckpointFuzz>(dir / "json" / "step.json");
  return {
      checkpointTarget(checkpoint, "manifest.json"),
      checkpointTarget(checkpoint, "model.pt"),
      checkpointTarget(checkpoint, "optimizer.pt"),
      {"json", json, readAndVerify},
      {"artifact", artifactSeeds(json), [](const Bytes& b) { spmd::readArtifact(b); }, true},
      // As the tools read a file: its kind told from its content first.
      {"artifact or module", modulesAndArtifacts(json),
       [](const Bytes& b) { spmd::loadGraphFrom(b, "fuzz", spmd::parseInputSpecs({"tokens:i64[4,16]", "targets:i64[4,16]"})); },
       true},
      {"torch.save", filesIn(dir / "torch_save"), [](const Bytes& b) { spmd::loadTorchSaveBytes(b); }, true},
      // A .pt2 as the tools read it: the program, then its weights (from a file, which they map).
      {"torch.export .pt2", filesIn(dir / "pt2"), [o](const Bytes& b) {
         spmd::loadGraphFrom(b, "fuzz", {});
         const std::string path = o.crashFile + ".pt2";
         std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
         spmd::loadExportedWeights(path);
       }, true},
      {"module with a member cut", modulesWithMembersCut(readFile("samples/lm.pt")),
       [o](const Bytes& b) { lowerAndPlace(b, o.crashFile + ".pt"); }, false, true},
      {"--input", lines(readFile(dir / "input_specs.txt")), [](const Bytes& b) { spmd::parseInputSpec(b); }},
      {"--data .npy", {readFile(dir / "numpy/x.npy"), readFile(dir / "numpy/tokens.npy")},
       [](const Bytes& b) { readDataFile(b, "x.npy"); }, true},
      {"--data .npz", {readFile(dir / "numpy/pair.npz")}, [](const Bytes& b) { readDataFile(b, "data.npz"); }, true},
  };
}

// Fuzzes one target; returns how many inputs failed the bar.
int fuzz(const Target& t, const Options& o) {
  std::mt19937 rng(o.seed);
  int failures = 0, accepted = 0;
  const auto start = std::chrono::steady_clock::now();
  const int rounds = t.enumerated ? static_cast<int>(t.seeds.size()) : o.rounds;
  for (int round = 0; round < rounds; ++round) {
    const Bytes input = inputFor(t, round, rng);
    std::ofstream(o.crashFile, std::ios::binary | std::ios::trunc) << input;
    // An enumerated target's first input is its file whole, which must be read.
    const bool isSeed = round < (t.enumerated ? 1 : static_cast<int>(t.seeds.size()));
    const auto before = std::chrono::steady_clock::now();
    bool wasAccepted = isSeed;
    std::string problem = isSeed ? seedProblem(t.reader, input) : runOne(t.reader, input, wasAccepted);
    accepted += wasAccepted ? 1 : 0;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - before).count();
    if (problem.empty() && ms > o.slowMs) problem = "took " + std::to_string(ms) + " ms";
    if (!problem.empty()) {
      ++failures;
      const std::string keep = o.crashFile + "." + t.name + "." + std::to_string(round);
      std::ofstream(keep, std::ios::binary) << input;
      std::cout << "FAIL " << t.name << " round " << round << ": " << problem << " (input in " << keep << ")\n";
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << t.name << ": " << rounds << " inputs (" << accepted << " read, the rest refused), " << failures
            << " failures, " << s << " s" << std::endl;
  return failures;
}

Options parseArgs(int argc, char** argv) {
  Options o;
  if (argc < 2) {
    std::cerr << "usage: spmd-fuzz-readers CORPUS_DIR [--rounds N] [--seed S] [--slow-ms MS] [--crash-file PATH]\n";
    std::exit(2);
  }
  o.corpus = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--rounds") o.rounds = std::stoi(value);
    else if (flag == "--seed") o.seed = static_cast<unsigned>(std::stoul(value));
    else if (flag == "--slow-ms") o.slowMs = std::stoi(value);
    else if (flag == "--crash-file") o.crashFile = value;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parseArgs(argc, argv);
  int failures = 0;
  for (const Target& t : targets(o)) failures += fuzz(t, o);
  for (const char* suffix : {"", ".pt", ".pt2"}) std::remove((o.crashFile + suffix).c_str());
  std::cout << (failures ? "FAILED: " : "ok: ") << failures << " failures" << std::endl;
  return failures ? 1 : 0;
}

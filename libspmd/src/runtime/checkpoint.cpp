#include "spmd/runtime/checkpoint.h"

#include "spmd/io/graph_json.h"
#include "spmd/io/torch_save.h"
#include "spmd/io/zip_members.h"
#include "spmd/ir/printer.h"
#include "spmd/ir/optimizer_state.h"
#include "spmd/ir/shard_layout.h"
#include "spmd/runtime/run_state.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/limits.h"
#include "spmd/support/mapped_file.h"
#include "spmd/support/text.h"
#include "spmd/support/write_all.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <map>
#include <sstream>

namespace spmd {
namespace {

constexpr const char* kFolderPrefix = "step-";
constexpr const char* kTempPrefix = ".tmp-";

// The optimizer.pt keys of each kind of state, as torch.optim names them.
const char* torchOptimKey(OptimizerState s) {
  switch (s) {
    case OptimizerState::Step: return "step";
    case OptimizerState::ExpAvg: return "exp_avg";
    case OptimizerState::ExpAvgSq: return "exp_avg_sq";
    case OptimizerState::MaxExpAvgSq: return "max_exp_avg_sq";
    case OptimizerState::MomentumBuffer: return "momentum_buffer";
  }
  return "";
}

constexpr OptimizerState kAllStates[] = {OptimizerState::Step, OptimizerState::ExpAvg, OptimizerState::ExpAvgSq,
                                         OptimizerState::MaxExpAvgSq, OptimizerState::MomentumBuffer};

std::string errnoText() { return std::strerror(errno); }

std::string folderName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "%s%08lld", kFolderPrefix, static_cast<long long>(step));
  return name;
}


std::vector<std::string> entriesOf(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool isDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Removes `path` and everything under it, as far as it can; returns the
// first failure ("PATH: why"), "" when all of it went. A file already gone
// is no failure.
std::string removeTree(const std::string& path) {
  std::string failure;
  const auto note = [&failure](const std::string& what) {
    if (failure.empty() && errno != ENOENT) failure = what + ": " + errnoText();
  };
  for (const std::string& name : entriesOf(path)) {
    if (name == "." || name == "..") continue;
    const std::string child = path + "/" + name;
    if (isDirectory(child)) {
      const std::string inner = removeTree(child);
      if (failure.empty()) failure = inner;
    } else if (::unlink(child.c_str()) != 0) {
      note(child);
    }
  }
  if (::rmdir(path.c_str()) != 0) note(path);
  return failure;
}

// Syncs a folder's entries to disk: a failure (EIO, ENOSPC) is an error, as
// the checkpoint might not survive a crash; a file system that cannot sync
// folders (EINVAL) has nothing to do.
void syncFolder(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Diagnostic("--checkpoint", "cannot open " + path + " to sync it: " + errnoText());
  const bool synced = ::fsync(fd) == 0 || errno == EINVAL;
  const std::string why = synced ? "" : errnoText();
  ::close(fd);
  if (!synced) throw Diagnostic("--checkpoint", "cannot sync " + path + ": " + why);
}

// Puts the complete folder `temp` at `folder`. Where one is there already,
// the two are exchanged in one step (renameat2), so that `folder` is never
// missing; the old one is then at `temp`, to be removed. A file system
// without the exchange gets two renames.
void putFolder(const std::string& temp, const std::string& folder) {
  if (!isDirectory(folder)) {
    if (::rename(temp.c_str(), folder.c_str()) == 0) return;
  } else if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, folder.c_str(), RENAME_EXCHANGE) == 0) {
    return;
  } else if (errno == EINVAL || errno == ENOSYS) {
    const std::string old = temp + ".old";
    if (::rename(folder.c_str(), old.c_str()) == 0 && ::rename(temp.c_str(), folder.c_str()) == 0 &&
        ::rename(old.c_str(), temp.c_str()) == 0) {
      return;
    }
  }
  throw Diagnostic("--checkpoint", "cannot put " + temp + " at " + folder + ": " + errnoText());
}

// Writes `bytes` to a new file and syncs it; a short write (a full disk, a
// file size limit) is an error naming the file.
void writeSynced(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Diagnostic("--checkpoint", "cannot create " + path + ": " + errnoText());
  if (!writeAll(fd, bytes.data(), bytes.size())) {
    const std::string why = errno ? errnoText() : "nothing written";
    ::close(fd);
    throw Diagnostic("--checkpoint", "cannot write " + path + ": " + why);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) throw Diagnostic("--checkpoint", "cannot write " + path + ": " + errnoText());
}

std::vector<std::pair<std::string, at::Tensor>> inputsOfKind(const Graph& g, const TensorMap& state,
                                                             std::initializer_list<InputKind> kinds) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (InputKind kind : kinds) {
    for (const auto& in : g.inputs()) {
      if (in.kind == kind) {
        const std::string& name = g.value(in.value).name;
        out.emplace_back(name, state.at(name));
      }
    }
  }
  return out;
}

std::vector<std::string> parameterNames(const Graph& g) {
  std::vector<std::string> names;
  for (const auto& in : g.inputs()) {
    if (in.kind == InputKind::Parameter) names.push_back(g.value(in.value).name);
  }
  return names;
}

// The state inputs that are optimizer state of a parameter: (parameter
// index, kind) by name.
std::map<std::string, std::pair<size_t, OptimizerState>> optimizerInputs(const Graph& g) {
  const std::vector<std::string> params = parameterNames(g);
  std::map<std::string, size_t> indexOf;
  for (size_t i = 0; i < params.size(); ++i) indexOf[params[i]] = i;
  std::map<std::string, std::pair<size_t, OptimizerState>> out;
  for (const auto& in : g.inputs()) {
    const std::string& name = g.value(in.value).name;
    const std::optional<OptimizerState> kind = in.kind == InputKind::State ? optimizerStateOf(name) : std::nullopt;
    if (!kind) continue;
    const std::string suffix = optimizerStateName("", *kind);
    auto param = indexOf.find(name.substr(0, name.size() - suffix.size()));
    if (param != indexOf.end()) out[name] = {param->second, *kind};
  }
  return out;
}

c10::IValue optimizerStateDict(const Graph& g, const TensorMap& state, std::optional<double> lr) {
  const std::vector<std::string> params = parameterNames(g);
  std::map<size_t, c10::impl::GenericDict> perParam;
  for (const auto& [name, where] : optimizerInputs(g)) {
    auto it = perParam.find(where.first);
    if (it == perParam.end()) {
      it = perParam.emplace(where.first, c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get())).first;
    }
    it->second.insert(torchOptimKey(where.second), state.at(name));
  }
  c10::impl::GenericDict perIndex(c10::IntType::get(), c10::AnyType::get());
  for (auto& [index, entry] : perParam) perIndex.insert(static_cast<int64_t>(index), entry);
  c10::impl::GenericList indices(c10::IntType::get());
  for (size_t i = 0; i < params.size(); ++i) indices.push_back(static_cast<int64_t>(i));
  c10::impl::GenericDict group(c10::StringType::get(), c10::AnyType::get());
  if (lr) group.insert("lr", *lr);
  group.insert("params", indices);
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(group);
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("state", perIndex);
  out.insert("param_groups", groups);
  return out;
}

TensorMap tensorDict(const std::string& path) {
  const c10::IValue v = loadTorchSave(path);
  if (!v.isGenericDict()) throw Diagnostic("", "expected a dict {name: tensor}").inFile(path);
  TensorMap out;
  for (const auto& item : v.toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor()) {
      throw Diagnostic("", "expected a dict {name: tensor}").inFile(path);
    }
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

// optimizer.pt back to the step's state names.
TensorMap optimizerTensors(const Graph& g, const std::string& path) {
  const c10::IValue v = loadTorchSave(path);
  const auto bad = [&](const std::string& what) { return Diagnostic("", what).inFile(path); };
  if (!v.isGenericDict()) throw bad("expected torch.optim's state_dict layout");
  c10::impl::GenericDict top = v.toGenericDict();
  if (!top.contains("state") || !top.at("state").isGenericDict()) throw bad("no 'state' dict");
  const std::vector<std::string> params = parameterNames(g);
  TensorMap out;
  for (const auto& item : top.at("state").toGenericDict()) {
    if (!item.key().isInt() || item.key().toInt() < 0 || item.key().toInt() >= static_cast<int64_t>(params.size()) ||
        !item.value().isGenericDict()) {
      throw bad("'state' holds an entry that is not a parameter index of this step");
    }
    const std::string& param = params[static_cast<size_t>(item.key().toInt())];
    for (const auto& field : item.value().toGenericDict()) {
      for (OptimizerState s : kAllStates) {
        if (field.key().isString() && field.key().toStringRef() == torchOptimKey(s) && field.value().isTensor()) {
          out[optimizerStateName(param, s)] = field.value().toTensor();
        }
      }
    }
  }
  return out;
}

}  // namespace

std::string checkpointFolder(const std::string& path) {
  if (!isDirectory(path)) throw Diagnostic("--resume " + path, "no such checkpoint folder");
  if (::access((path + "/manifest.json").c_str(), F_OK) == 0) return path;
  std::ifstream latest(path + "/latest");
  std::string name;
  if (!(latest >> name) || !startsWith(name, kFolderPrefix) || !isDirectory(path + "/" + name)) {
    throw Diagnostic("--resume " + path, "holds no checkpoint (no manifest.json, no valid 'latest')");
  }
  return path + "/" + name;
}

namespace {

void requireSameType(const std::string& name, const at::Tensor& have, const Value& want, const std::string& file) {
  if (have.sizes().vec() != want.shape || have.scalar_type() != want.dtype) {
    const Value got{name, have.scalar_type(), have.sizes().vec()};
    throw Diagnostic("'" + name + "'", "holds " + typeText(got) + ", the step takes " + typeText(want)).inFile(file);
  }
}

// The value `t` of input `v` to copy into the state: `t` itself, or rank
// `rank`'s shard of it when the input takes shards of a whole tensor (a
// sharded step, whole weights); else a Diagnostic naming `file`.
at::Tensor fitted(const Graph& g, const Value& v, const at::Tensor& t, int rank, const std::string& file) {
  const int64_t world = g.training().worldSize;
  if (t.scalar_type() == v.dtype && isShardOf(v.shape, t.sizes().vec(), world)) return rankShardOf(t, world, rank);
  requireSameType(v.name, t, v, file);
  return t;
}

// Bytes of a file, or of the files directly in a folder (a folder of .npy).
uint64_t bytesOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  if (!S_ISDIR(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  uint64_t total = 0;
  for (const std::string& name : entriesOf(path)) {
    struct stat member {};
    if (::stat((path + "/" + name).c_str(), &member) == 0 && S_ISREG(member.st_mode)) total += member.st_size;
  }
  return total;
}

std::string baseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string dataIdentity(const std::string& dataFile, const std::string& tokens) {
  const std::string& path = dataFile.empty() ? tokens : dataFile;
  if (path.empty()) return "random inputs";
  return std::string(dataFile.empty() ? "--tokens " : "--data ") + baseName(path) + " (" +
         std::to_string(bytesOf(path)) + " bytes)";
}

std::string stepFingerprint(const Artifact& artifact) {
  // Where the weights were first read from, and the flags recorded, are no
  // part of the step.
  Graph step = artifact.graph;
  step.setWeights(WeightsRef{});
  step.setFlags({});
  const std::string text = writeGraphJson(step) + "\ndevice " + artifact.device;
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

CheckpointWriter::CheckpointWriter(std::string root, int keep) : root_(std::move(root)), keep_(keep) {
  if (keep_ < 1) throw Diagnostic("--keep", "must be at least 1");
  if (!isDirectory(root_) && ::mkdir(root_.c_str(), 0755) != 0) {
    throw Diagnostic("--checkpoint " + root_, "cannot create the folder: " + errnoText());
  }
  if (::access(root_.c_str(), W_OK) != 0) throw Diagnostic("--checkpoint " + root_, "cannot write to it: " + errnoText());
  // Two runs writing one folder would remove each other's temporary folders.
  lock_ = ::open((root_ + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_ < 0) throw Diagnostic("--checkpoint " + root_, "cannot create .lock: " + errnoText());
  if (::flock(lock_, LOCK_EX | LOCK_NB) != 0) {
    const bool busy = errno == EWOULDBLOCK;
    const std::string why = errnoText();
    ::close(lock_);
    lock_ = -1;
    throw Diagnostic("--checkpoint " + root_, busy ? "another run is writing checkpoints here (it holds " + root_ +
                                                         "/.lock); give each run its own folder"
                                                   : "cannot lock .lock: " + why);
  }
  for (const std::string& name : entriesOf(root_)) {
    if (startsWith(name, kTempPrefix)) removeTree(root_ + "/" + name);
  }
}

CheckpointWriter::~CheckpointWriter() {
  if (lock_ >= 0) ::close(lock_);
}

std::vector<std::string> CheckpointWriter::write(const Graph& g, const TensorMap& state,
                                                 const CheckpointInfo& info) const {
  const std::string name = folderName(info.step);
  const std::string temp = root_ + "/" + kTempPrefix + name + "." + std::to_string(::getpid());
  removeTree(temp);
  if (::mkdir(temp.c_str(), 0755) != 0) throw Diagnostic("--checkpoint", "cannot create " + temp + ": " + errnoText());
  try {
    const auto optimizerNames = optimizerInputs(g);
    std::vector<std::pair<std::string, at::Tensor>> extra;
    for (const auto& [n, t] : inputsOfKind(g, state, {InputKind::State})) {
      if (!optimizerNames.count(n)) extra.emplace_back(n, t);
    }
    CheckpointInfo withDigests = info;
    const auto writeMember = [&](const std::string& file, const std::string& bytes) {
      writeSynced(temp + "/" + file, bytes);
      withDigests.digests[file] = zipDigest(bytes);
    };
    writeMember("model.pt", saveTorchSave(inputsOfKind(g, state, {InputKind::Parameter, InputKind::Buffer})));
    writeMember("optimizer.pt", saveTorchSaveValue(optimizerStateDict(g, state, info.lr)));
    writeMember("extra.pt", saveTorchSave(extra));
    if (!info.config.empty()) writeSynced(temp + "/config.toml", info.config);
    writeSynced(temp + "/manifest.json", manifestText(withDigests));
    syncFolder(temp);
  } catch (...) {
    removeTree(temp);
    throw;
  }
  // A folder of this step from an earlier run goes only once the new one is complete.
  const std::string folder = root_ + "/" + name;
  try {
    putFolder(temp, folder);
  } catch (...) {
    removeTree(temp);
    throw;
  }
  removeTree(temp);  // the earlier folder, if there was one
  writeSynced(root_ + "/" + kTempPrefix + "latest", name + "\n");
  if (::rename((root_ + "/" + kTempPrefix + "latest").c_str(), (root_ + "/latest").c_str()) != 0) {
    throw Diagnostic("--checkpoint", "cannot update " + root_ + "/latest: " + errnoText());
  }
  syncFolder(root_);
  return prune(name);
}

// Keeps the newest: `newest` and the keep - 1 before it (names sort by
// step). A folder is first renamed out of the step-* names, so that one
// half removed never looks like a checkpoint. The new checkpoint is whole
// by now, so a folder that cannot go is a note, not the run's end: the
// next checkpoint tries again (a half-removed one, under its temporary
// name, goes when a writer next opens the root).
std::vector<std::string> CheckpointWriter::prune(const std::string& newest) const {
  std::vector<std::string> folders;
  for (const std::string& entry : entriesOf(root_)) {
    if (startsWith(entry, kFolderPrefix) && entry != newest) folders.push_back(entry);
  }
  std::vector<std::string> notes;
  const size_t older = static_cast<size_t>(keep_ - 1);
  for (size_t i = 0; i + older < folders.size(); ++i) {
    const std::string folder = root_ + "/" + folders[i];
    const std::string doomed = root_ + "/" + kTempPrefix + "pruned-" + folders[i];
    if (::rename(folder.c_str(), doomed.c_str()) != 0) {
      notes.push_back("cannot remove the old checkpoint " + folder + " (" + errnoText() + "); it stays");
    } else if (const std::string failure = removeTree(doomed); !failure.empty()) {
      notes.push_back("cannot remove all of the old checkpoint " + folders[i] + ", renamed to " + doomed +
                      " (" + failure + ")");
    }
  }
  return notes;
}

namespace {

// The manifest's step against what else records it: the folder's name
// (where it is still step-NNNNNNNN) and Adam's step counts, which count the
// steps done. An edited manifest would resume the schedule, the data and
// the random streams at another step than the weights were trained to.
void requireConsistentStep(const Checkpoint& c) {
  const std::string manifest = c.folder + "/manifest.json";
  const std::string name = c.folder.substr(c.folder.find_last_of('/') + 1);
  if (name.size() == folderName(0).size() && startsWith(name, kFolderPrefix) &&
      name.find_first_not_of("0123456789", std::string(kFolderPrefix).size()) == std::string::npos &&
      name != folderName(c.info.step)) {
    throw Diagnostic("/step", std::to_string(c.info.step) + ", but the folder is " + name).inFile(manifest);
  }
  const std::string suffix = "." + std::string(torchOptimKey(OptimizerState::Step));
  for (const auto& [stateName, t] : c.optimizer) {
    const bool isStep = stateName.size() > suffix.size() &&
                        stateName.compare(stateName.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (isStep && t.numel() == 1 && t.item<double>() != static_cast<double>(c.info.step)) {
      throw Diagnostic("/step", std::to_string(c.info.step) + ", but optimizer.pt's Adam has taken " +
                                    std::to_string(static_cast<int64_t>(t.item<double>())) + " steps").inFile(manifest);
    }
  }
}

}  // namespace

namespace {

constexpr const char* kShardIndexFormat = "spmd-sharded-checkpoint";

// The steps a checkpoint root holds whole (a step folder with a manifest).
std::set<int64_t> wholeSteps(const std::string& root) {
  std::set<int64_t> steps;
  for (const std::string& name : entriesOf(root)) {
    if (!startsWith(name, kFolderPrefix) || ::access((root + "/" + name + "/manifest.json").c_str(), F_OK) != 0) continue;
    char* end = nullptr;
    const long long step = std::strtoll(name.c_str() + std::strlen(kFolderPrefix), &end, 10);
    if (end && *end == '\0') steps.insert(step);
  }
  return steps;
}

}  // namespace

std::string rankCheckpointRoot(const std::string& root, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "/rank-%05d", rank);
  return root + name;
}

std::string shardedCheckpointRoot(const std::string& root, int rank, int worldSize, const Artifact& artifact) {
  const Graph& g = artifact.graph;
  if (::mkdir(root.c_str(), 0777) != 0 && errno != EEXIST) {
    throw Diagnostic("--checkpoint " + root, "cannot create the folder: " + errnoText());
  }
  if (rank == 0) {
    nlohmann::ordered_json j = {{"format", kShardIndexFormat}, {"version", kCheckpointVersion},
                                {"world_size", worldSize}, {"shard", shardModeName(g.training().shard)}};
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    for (int r = 0; r < worldSize; ++r) ranks.push_back(rankCheckpointRoot("", r).substr(1));
    j["ranks"] = ranks;
    nlohmann::ordered_json params = nlohmann::ordered_json::array();
    for (const auto& in : g.inputs()) {
      const std::string& name = g.value(in.value).name;
      if (in.kind == InputKind::Parameter) params.push_back({name, artifact.state.at(name).sizes().vec()});
    }
    j["parameters"] = params;
    const std::string temp = root + "/" + kTempPrefix + "index.json";
    writeSynced(temp, j.dump(2) + "\n");
    if (::rename(temp.c_str(), (root + "/index.json").c_str()) != 0) {
      throw Diagnostic("--checkpoint", "cannot write " + root + "/index.json: " + errnoText());
    }
  }
  return rankCheckpointRoot(root, rank);
}

bool isShardedCheckpoint(const std::string& root) { return ::access((root + "/index.json").c_str(), F_OK) == 0; }

std::string shardedCheckpointFolder(const std::string& root, int rank, int worldSize) {
  const std::string index = root + "/index.json";
  if (!isShardedCheckpoint(root)) {
    throw Diagnostic("--resume " + root, "holds no sharded checkpoint (no index.json); a sharded step resumes from "
                                         "the --checkpoint folder its run wrote");
  }
  int written = 0;
  try {
    const nlohmann::json j = nlohmann::json::parse(readText(index));
    if (j.value("format", "") != kShardIndexFormat) throw Diagnostic("/format", "not an spmd sharded checkpoint index");
    written = j.at("world_size").get<int>();
  } catch (Diagnostic& d) {
    throw d.inFile(index);
  } catch (const nlohmann::json::exception& e) {
    throw Diagnostic("", std::string("damaged index: ") + e.what()).inFile(index);
  }
  if (written != worldSize) {
    throw Diagnostic("--resume " + root, "was written by a sharded run of " + std::to_string(written) +
                                             " ranks, this one has " + std::to_string(worldSize) +
                                             ": the shards' shapes depend on it; --resume-weights-only takes the "
                                             "weights alone");
  }
  std::set<int64_t> common;
  for (int r = 0; r < worldSize; ++r) {
    const std::string dir = rankCheckpointRoot(root, r);
    if (!isDirectory(dir)) throw Diagnostic("--resume " + root, "has no folder for rank " + std::to_string(r));
    const std::set<int64_t> steps = wholeSteps(dir);
    std::set<int64_t> both;
    std::set_intersection(common.begin(), common.end(), steps.begin(), steps.end(), std::inserter(both, both.end()));
    common = r == 0 ? steps : both;
  }
  if (common.empty()) throw Diagnostic("--resume " + root, "holds no step that every rank's folder has whole");
  return rankCheckpointRoot(root, rank) + "/" + folderName(*common.rbegin());
}


Checkpoint readCheckpoint(const Graph& g, const std::string& path, bool weightsOnly) {
  Checkpoint c;
  c.folder = checkpointFolder(path);
  c.info = parseManifest(c.folder + "/manifest.json");
  requireManifestMembers(c);
  c.model = tensorDict(c.folder + "/model.pt");
  if (weightsOnly) return c;
  c.optimizer = optimizerTensors(g, c.folder + "/optimizer.pt");
  c.extra = tensorDict(c.folder + "/extra.pt");
  requireConsistentStep(c);
  return c;
}

void restoreState(const Graph& g, const Checkpoint& c, bool weightsOnly, int rank, TensorMap& state) {
  const auto optimizerNames = optimizerInputs(g);
  for (const auto& in : g.inputs()) {
    if (isPerStepInput(in.kind)) continue;
    const bool weight = in.kind == InputKind::Parameter || in.kind == InputKind::Buffer;
    if (weightsOnly && !weight) continue;
    const Value& v = g.value(in.value);
    const bool optimizer = !weight && optimizerNames.count(v.name);
    const TensorMap& from = weight ? c.model : optimizer ? c.optimizer : c.extra;
    const std::string file = c.folder + (weight ? "/model.pt" : optimizer ? "/optimizer.pt" : "/extra.pt");
    auto it = from.find(v.name);
    if (it == from.end()) throw Diagnostic("'" + v.name + "'", "the checkpoint holds no value for it").inFile(file);
    state[v.name].copy_(fitted(g, v, it->second, rank, file));
  }
}

std::vector<std::string> initFromStateDict(const Graph& g, const std::string& file, int rank, TensorMap& state) {
  TensorMap loaded = tensorDict(file);
  for (const auto& in : g.inputs()) {
    if (in.kind != InputKind::Parameter && in.kind != InputKind::Buffer) continue;
    const Value& v = g.value(in.value);
    auto it = loaded.find(v.name);
    if (it == loaded.end()) {
      if (in.kind == InputKind::Buffer) continue;  // buffers keep the artifact's values
      throw Diagnostic("'" + v.name + "'", "the state dict has no value for this parameter").inFile(file);
    }
    state[v.name].copy_(fitted(g, v, it->second, rank, file));
    loaded.erase(it);
  }
  std::vector<std::string> unused;
  for (const auto& [name, tensor] : loaded) unused.push_back(name);
  return unused;
}

}  // namespace spmd

// Checkpoints of a run (spmd-run --checkpoint DIR, --resume DIR): every
// value a rank's step reads and updates, saved as files PyTorch reads, and
// read back so that a resumed run continues bit for bit.
//
// DIR holds one folder per checkpoint, step-NNNNNNNN (the steps done), and
// `latest` (the name of the newest). A folder holds
//   model.pt       {name: tensor}: parameters, then buffers, as the module's
//                  named_parameters() / named_buffers() name them
//                  (model.load_state_dict reads it)
//   optimizer.pt   torch.optim's state_dict() layout: {"state": {index:
//                  {"step", "exp_avg", ...} or {"momentum_buffer"}},
//                  "param_groups": [{"params": [indices], "lr": rate}]},
//                  indices in named_parameters() order
//   extra.pt       {name: tensor}: the rest of the step's state (values an
//                  unrolled graph carries, flags such as SGD's first step)
//   manifest.json  format, version, step, world size, the step's
//                  fingerprint, seed, learning rate
// A folder is written under a temporary name, synced and renamed, so a crash
// while writing leaves the previous checkpoints as they were.
//
// A sharded step (spmd-split --shard) is checkpointed by every rank: DIR
// holds index.json (format "spmd-sharded-checkpoint", world size, shard
// mode, the rank folders) and rank-KKKKK/ per rank, each a checkpoint root
// as above whose optimizer.pt holds that rank's shards (dim-0 shards of
// ceil(rows / world) rows, zero-padded: passes/shard.cpp). A resume reads
// the newest step every rank's folder holds whole. `python3 -m spmd_checkpoint
// merge DIR OUT` (python/) joins the shards into one checkpoint folder.
#pragma once

#include "spmd/io/artifact.h"
#include "spmd/runtime/executor.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spmd {

// What a checkpoint says about the run it was taken from.
struct CheckpointInfo {
  int64_t step = 0;       // steps done
  int worldSize = 1;
  std::string fingerprint;  // stepFingerprint() of the artifact
  uint64_t seed = 0;        // spmd-run --seed (random inputs, dropout)
  std::optional<double> lr;  // the last step's scheduled learning rate
  std::string data;          // what the run trained on (dataIdentity()), "" when not recorded
  // Each member file's digest (zipDigest), by file name; empty in checkpoints
  // written before they were recorded, whose members are then not compared.
  std::map<std::string, std::string> digests;
  // A sharded run's rank whose shards the folder holds (unset in unsharded
  // checkpoints and in sharded ones written before it was recorded): a
  // resume and the merge tool refuse rank folders swapped or copied.
  std::optional<int> rank;
  // The run's resolved configuration (spmd-train's config.toml), written
  // beside the members as config.toml when not empty; not in the manifest.
  std::string config;
  // The flags the artifact's stages recorded (Graph::flags()), in the
  // manifest: a resume of another step names the flag that differs.
  std::vector<std::vector<std::string>> flags;
  // The command that ran (spmd-run or spmd-train and its arguments, as
  // given), in the manifest: what wrote the checkpoint; no resume compares it.
  std::vector<std::string> command;
};

// What a run's data is, as a resume compares it: "random inputs", or the
// flag, the file's or folder's name and its size in bytes.
std::string dataIdentity(const std::string& dataFile, const std::string& tokens);

// A digest of what a step computes: the artifact's graph (as its canonical
// JSON) and device. Artifacts lowered again from the same graph agree; any
// edit to the step does not.
std::string stepFingerprint(const Artifact& artifact);

class CheckpointWriter {
 public:
  // Creates `root` if needed, refuses one it cannot write or that another
  // run writes to (it holds root/.lock while it lives; Diagnostic naming
  // --checkpoint), and removes temporary folders a crashed writer left.
  // `keep`: how many checkpoints stay (older ones are removed), >= 1.
  CheckpointWriter(std::string root, int keep);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Writes the checkpoint of `state` after `info.step` steps. Throws
  // Diagnostic when it cannot; the previous checkpoints are then intact.
  // A kill at any point leaves `latest` naming a whole checkpoint, and every
  // step-* folder whole: a folder is replaced by an atomic exchange, and
  // pruned by first moving it to a temporary name. Returns notes on older
  // checkpoints it could not remove (the new one is whole all the same).
  std::vector<std::string> write(const Graph& g, const TensorMap& state, const CheckpointInfo& info) const;

 private:
  std::vector<std::string> prune(const std::string& newest) const;

  std::string root_;
  int keep_;
  int lock_ = -1;  // root/.lock, flock()ed for the writer's life
};

struct Checkpoint {
  std::string folder;  // the step-NNNNNNNN folder read
  CheckpointInfo info;
  TensorMap model;      // model.pt
  TensorMap optimizer;  // optimizer.pt's tensors by the step's state names (<param>.exp_avg, ...)
  TensorMap extra;      // extra.pt
};

// Where rank `rank` of a sharded step's run keeps its checkpoints under
// --checkpoint `root`. shardedCheckpointRoot also creates `root` and, on
// rank 0, writes its index.json, which lists the parameters in
// named_parameters() order with their whole shapes (`g`'s parameter inputs
// are this rank's shards where the step shards them; the artifact's values
// are whole).
std::string rankCheckpointRoot(const std::string& root, int rank);
std::string shardedCheckpointRoot(const std::string& root, int rank, int worldSize, const Artifact& artifact);
// Whether `root` holds a sharded checkpoint (an index.json).
bool isShardedCheckpoint(const std::string& root);

// For a --resume of a sharded step: `root`'s index must record `worldSize`
// ranks (Diagnostic naming --resume otherwise); returns rank `rank`'s folder
// of the newest step all ranks hold whole.
std::string shardedCheckpointFolder(const std::string& root, int rank, int worldSize);

// Where a --resume path's checkpoint is: the path itself (a step folder), or
// the folder its `latest` names. Throws Diagnostic naming --resume.
std::string checkpointFolder(const std::string& path);

// Reads `path`: a checkpoint folder, or a --checkpoint root (its latest);
// with `weightsOnly`, only the manifest and model.pt. Throws Diagnostic
// naming the file for anything missing or damaged.
Checkpoint readCheckpoint(const Graph& g, const std::string& path, bool weightsOnly);

// Puts a checkpoint's values into `state` (the run's state, every graph
// input that is not per-step). With `weightsOnly`, only the parameters and
// buffers; else every value, and the checkpoint must hold each one. Shapes
// and dtypes must match the graph's (Diagnostic naming the value), or be
// the whole tensor of an input that takes rank `rank`'s shard of it.
void restoreState(const Graph& g, const Checkpoint& checkpoint, bool weightsOnly, int rank, TensorMap& state);

// Replaces parameters and buffers in `state` with those of a PyTorch
// state_dict file (torch.save(model.state_dict())): every parameter must be
// there with the graph's shape; names the graph does not have are ignored
// (returned, for a note).
std::vector<std::string> initFromStateDict(const Graph& g, const std::string& file, int rank, TensorMap& state);

// ---- manifest.json and member digests (checkpoint_manifest.cpp) ----------

// The version of a step's manifest and of a sharded checkpoint's index.
constexpr int kCheckpointVersion = 1;

// The whole file at `path`; throws Diagnostic naming it.
std::string readText(const std::string& path);

// A member file's digest (a torch.save zip's bytes): its zip members' names,
// sizes and CRC-32s, as its central directory records them, hashed.
std::string zipDigest(std::string_view zip);

// manifest.json's text for `info`, and `info` read back from a manifest,
// every field checked (Diagnostic naming the file and the field).
std::string manifestText(const CheckpointInfo& info);
CheckpointInfo parseManifest(const std::string& path);

// Each member whose digest `c`'s manifest holds against that digest: a file
// copied in from another step or run is refused (Diagnostic naming it).
void requireManifestMembers(const Checkpoint& c);

}  // namespace spmd

// manifest.json and the member digests of checkpoint steps: what
// checkpoint.cpp's writer records and its reader checks (runtime/checkpoint.h).
#include "spmd/runtime/checkpoint.h"

#include "spmd/io/zip_members.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/limits.h"
#include "spmd/support/mapped_file.h"
#include "spmd/support/text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace spmd {
namespace {

constexpr const char* kFormat = "spmd-checkpoint";

// A manifest's integer field: 2.5, "2" and 2^70 are refused, not truncated.
int64_t integerField(const nlohmann::json& j, const char* name) {
  const nlohmann::json& v = j.at(name);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    throw Diagnostic(std::string("/") + name, "must be an integer, not " + v.dump());
  }
  return v.get<int64_t>();
}

}  // namespace

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Diagnostic("", std::string("cannot open: ") + std::strerror(errno)).inFile(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A member file's digest: its zip members' names, sizes and CRC-32s, as its
// central directory records them, hashed (FNV-1a, 64 bits). A file of another
// step or run, whose tensors differ, has another; reading it takes only the
// directory, not the tensors.
std::string zipDigest(std::string_view zip) {
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;  // a separator no name holds
  };
  for (const ZipMember& m : zipMembers(zip)) {
    mix(m.name);
    mix(std::to_string(m.size));
    mix(std::to_string(m.crc32));
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::string manifestText(const CheckpointInfo& info) {
  nlohmann::ordered_json j = {{"format", kFormat},          {"version", kCheckpointVersion},
                              {"step", info.step},          {"world_size", info.worldSize},
                              {"fingerprint", info.fingerprint}, {"seed", info.seed}};
  if (info.lr) j["lr"] = *info.lr;
  if (!info.data.empty()) j["data"] = info.data;
  if (!info.digests.empty()) j["digests"] = info.digests;
  if (info.rank) j["rank"] = *info.rank;
  if (!info.flags.empty()) j["flags"] = info.flags;
  if (!info.command.empty()) j["command"] = info.command;
  return j.dump(2) + "\n";
}

CheckpointInfo parseManifest(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(readText(path));
    if (j.value("format", "") != kFormat) throw Diagnostic("/format", "not an spmd checkpoint manifest");
    if (j.value("version", 0) != kCheckpointVersion) {
      throw Diagnostic("/version", "version " + std::to_string(j.value("version", 0)) + " is not " +
                                       std::to_string(kCheckpointVersion) + ", the one this spmd-run reads");
    }
    CheckpointInfo info;
    info.step = integerField(j, "step");
    info.worldSize = static_cast<int>(std::clamp<int64_t>(integerField(j, "world_size"), 0, INT32_MAX));
    info.fingerprint = j.at("fingerprint").get<std::string>();
    // A 64-bit unsigned integer: nlohmann reads -5 as 2^64 - 5 and 2^70 as a float.
    if (!j.at("seed").is_number_unsigned()) throw Diagnostic("/seed", "must be an integer from 0 to 2^64 - 1");
    info.seed = j.at("seed").get<uint64_t>();
    if (j.contains("lr")) info.lr = j.at("lr").get<double>();
    if (j.contains("data")) info.data = j.at("data").get<std::string>();
    if (j.contains("digests")) info.digests = j.at("digests").get<std::map<std::string, std::string>>();
    if (j.contains("flags")) info.flags = j.at("flags").get<std::vector<std::vector<std::string>>>();
    if (j.contains("command")) info.command = j.at("command").get<std::vector<std::string>>();
    if (info.step < 0 || info.step > kMaxRunSteps) {
      throw Diagnostic("/step", std::to_string(info.step) + " is outside the steps a run can have (0 to " +
                                    std::to_string(kMaxRunSteps) + ")");
    }
    if (info.worldSize < 1) throw Diagnostic("/world_size", "must be at least 1");
    if (j.contains("rank")) {
      const int64_t rank = integerField(j, "rank");
      if (rank < 0 || rank >= info.worldSize) {
        throw Diagnostic("/rank", std::to_string(rank) + " is not a rank of a run of " + std::to_string(info.worldSize));
      }
      info.rank = static_cast<int>(rank);
    }
    return info;
  } catch (Diagnostic& d) {
    throw d.inFile(path);
  } catch (const nlohmann::json::exception& e) {
    throw Diagnostic("", std::string("damaged manifest: ") + e.what()).inFile(path);
  }
}

// Each member the manifest has a digest of against that digest: a file
// copied in from another step or run (each whole, its CRCs valid) is refused.
void requireManifestMembers(const Checkpoint& c) {
  for (const auto& [file, digest] : c.info.digests) {
    if (file != "model.pt" && file != "optimizer.pt" && file != "extra.pt") {
      throw Diagnostic("/digests", "names '" + file + "', which no checkpoint holds").inFile(c.folder + "/manifest.json");
    }
    const std::string path = c.folder + "/" + file;
    const MappedFile mapped(path);
    std::string found;
    try {
      found = zipDigest(mapped.view());
    } catch (Diagnostic& d) {
      throw d.inFile(path);
    }
    if (found != digest) {
      throw Diagnostic("", "is not the file this step's manifest.json was written with (digest " + found +
                               ", the manifest's " + digest + "): a file of another step or run")
          .inFile(path);
    }
  }
}

}  // namespace spmd

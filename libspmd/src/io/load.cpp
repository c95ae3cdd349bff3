#include "spmd/io/load.h"

#include "spmd/io/artifact.h"
#include "spmd/io/exported_program.h"
#include "spmd/io/graph_json.h"
#include "spmd/io/torchscript.h"
#include "spmd/io/zip_members.h"
#include "spmd/ir/parser.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/limits.h"
#include "spmd/support/mapped_file.h"
#include "spmd/support/phase_times.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <iostream>

namespace spmd {
namespace {

bool isRegularFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Reads all of `fd` (stdin, a pipe, a FIFO, a device) in large blocks, up
// to kMaxStreamBytes.
std::string readStream(int fd) {
  std::string bytes;
  std::vector<char> block(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, block.data(), block.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Diagnostic("", std::string("cannot read: ") + std::strerror(errno));
    if (n == 0) return bytes;
    if (static_cast<int64_t>(bytes.size()) + n > kMaxStreamBytes) {
      throw Diagnostic("", "more than " + std::to_string(kMaxStreamBytes >> 30) +
                               " GiB from a pipe or device: write it to a file, which is mapped at any size");
    }
    bytes.append(block.data(), static_cast<size_t>(n));
  }
}

bool isZip(std::string_view bytes) { return bytes.substr(0, 4) == std::string_view("PK\x03\x04", 4); }

char firstNonSpace(std::string_view bytes) {
  for (char c : bytes) {
    if (!std::isspace(static_cast<unsigned char>(c))) return c;
  }
  return 0;
}

}  // namespace

InputBytes::InputBytes(const std::string& path) {
  try {
    if (path == "-") {
      read_ = readStream(STDIN_FILENO);
    } else if (isRegularFile(path)) {
      file_ = std::make_shared<MappedFile>(path, MappedFile::Access::CopyOnWrite);
    } else {
      refuseDirectory(path);
      const int fd = ::open(path.c_str(), O_RDONLY);
      if (fd < 0) throw Diagnostic("", std::string("cannot open: ") + std::strerror(errno));
      try {
        read_ = readStream(fd);
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
    }
  } catch (Diagnostic& d) {
    // MappedFile names the path itself; the rest name no file yet.
    if (d.file().empty()) d.inFile(displayNameOf(path));
    throw;
  }
}

std::string_view InputBytes::view() const { return file_ ? file_->view() : std::string_view(read_); }

void refuseDirectory(const std::string& path) {
  struct stat st {};
  // An ifstream opens a directory and fails on the first read, with a
  // message that names no file.
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) throw Diagnostic("", "is a directory, not a file");
}

std::string readInput(const std::string& path) { return std::string(InputBytes(path).view()); }

LoadedGraph loadGraph(const std::string& path, const std::vector<InputSpec>& specs) {
  TimedPhase phase("read " + displayNameOf(path));
  const InputBytes input(path);
  LoadedGraph loaded = loadGraphFrom(input.view(), displayNameOf(path), specs, input.mapping());
  // A dump's relative weights path is relative to the dump, wherever it is read from.
  const bool names = loaded.format == InputFormat::Json || loaded.format == InputFormat::Listing;
  if (names && path != "-" && !loaded.graph.weights().file.empty()) {
    WeightsRef w = loaded.graph.weights();
    const size_t slash = path.find_last_of('/');
    w.baseDir = slash == std::string::npos ? "" : slash == 0 ? "/" : path.substr(0, slash);
    loaded.graph.setWeights(std::move(w));
  }
  return loaded;
}

LoadedGraph loadGraphFrom(std::string_view bytes, const std::string& displayName, const std::vector<InputSpec>& specs,
                          const std::shared_ptr<MappedFile>& mapping) {
  LoadedGraph loaded;
  loaded.displayName = displayName;
  try {
    if (bytes.empty()) throw Diagnostic("", "empty input");
    if (isZip(bytes)) checkZipStructure(bytes, ZipCrc::UpTo1MiB);
    if (isZip(bytes) && isArtifact(bytes)) {
      loaded.format = InputFormat::Artifact;
      const bool inMapping = mapping && bytes.data() == mapping->bytes() && bytes.size() == mapping->size();
      if (inMapping) mapping->prefault();  // the checksum reads all of it
      loaded.artifact = std::make_shared<Artifact>(readArtifact(bytes, inMapping ? mapping : nullptr));
      loaded.graph = loaded.artifact->graph;
    } else if (isZip(bytes) && isExportedProgram(bytes)) {
      loaded.format = InputFormat::ExportedProgram;
      const bool inMapping = mapping && bytes.data() == mapping->bytes() && bytes.size() == mapping->size();
      loaded.graph = importExportedProgram(bytes, loaded.displayName, specs, inMapping ? mapping : nullptr);
    } else if (isZip(bytes)) {
      loaded.format = InputFormat::TorchScript;
      loaded.graph = importTorchScript(bytes, loaded.displayName, specs);
    } else if (firstNonSpace(bytes) == '{') {
      loaded.format = InputFormat::Json;
      loaded.graph = readGraphJson(std::string(bytes));
    } else {
      const std::string text(bytes);
      if (!looksLikeListing(text)) throw Diagnostic("", "neither a torch.export program or TorchScript module (zip) nor a JSON graph dump or listing");
      loaded.format = InputFormat::Listing;
      loaded.graph = parseListing(text);
    }
  } catch (Diagnostic& d) {
    throw d.inFile(loaded.displayName);
  }
  return loaded;
}

}  // namespace spmd

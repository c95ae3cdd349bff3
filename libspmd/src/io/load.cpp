#include "spmd/io/load.h"

#include "spmd/io/artifact.h"
#include "spmd/io/graph_json.h"
#include "spmd/io/torchscript.h"
#include "spmd/ir/parser.h"
#include "spmd/support/diagnostic.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

namespace spmd {
namespace {

std::string readAll(const std::string& path) {
  if (path == "-") {
    std::ostringstream buffer;
    buffer << std::cin.rdbuf();
    return buffer.str();
  }
  refuseDirectory(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Diagnostic("", std::string("cannot open: ") + std::strerror(errno));
  try {
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure&) {
    // libstdc++'s "basic_filebuf::underflow error reading the file".
    throw Diagnostic("", std::string("cannot read: ") + std::strerror(errno));
  }
}

bool isZip(const std::string& bytes) { return bytes.size() >= 4 && bytes.compare(0, 4, "PK\x03\x04") == 0; }

char firstNonSpace(const std::string& bytes) {
  for (char c : bytes) {
    if (!std::isspace(static_cast<unsigned char>(c))) return c;
  }
  return 0;
}

}  // namespace

void refuseDirectory(const std::string& path) {
  struct stat st {};
  // An ifstream opens a directory and fails on the first read, with a
  // message that names no file.
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) throw Diagnostic("", "is a directory, not a file");
}

std::string displayNameOf(const std::string& path) { return path == "-" ? "<stdin>" : path; }

std::string readInput(const std::string& path) {
  try {
    return readAll(path);
  } catch (Diagnostic& d) {
    throw d.inFile(displayNameOf(path));
  }
}

LoadedGraph loadGraph(const std::string& path, const std::vector<InputSpec>& specs) {
  LoadedGraph loaded = loadGraphFrom(readInput(path), displayNameOf(path), specs);
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

LoadedGraph loadGraphFrom(const std::string& bytes, const std::string& displayName, const std::vector<InputSpec>& specs) {
  LoadedGraph loaded;
  loaded.displayName = displayName;
  try {
    if (bytes.empty()) throw Diagnostic("", "empty input");
    if (isZip(bytes) && isArtifact(bytes)) {
      loaded.format = InputFormat::Artifact;
      loaded.artifact = std::make_shared<Artifact>(readArtifact(bytes));
      loaded.graph = loaded.artifact->graph;
    } else if (isZip(bytes)) {
      loaded.format = InputFormat::TorchScript;
      loaded.graph = importTorchScript(bytes, loaded.displayName, specs);
    } else if (firstNonSpace(bytes) == '{') {
      loaded.format = InputFormat::Json;
      loaded.graph = readGraphJson(bytes);
    } else if (looksLikeListing(bytes)) {
      loaded.format = InputFormat::Listing;
      loaded.graph = parseListing(bytes);
    } else {
      throw Diagnostic("", "neither a TorchScript module (zip) nor a JSON graph dump");
    }
  } catch (Diagnostic& d) {
    throw d.inFile(loaded.displayName);
  }
  return loaded;
}

void writeOutput(const std::string& path, const std::string& content) {
  if (path == "-") {
    std::cout << content << std::flush;
    return;
  }
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    out << content;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw Diagnostic("", std::string("cannot write: ") + std::strerror(errno)).inFile(path);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Diagnostic("", std::string("cannot write: ") + std::strerror(errno)).inFile(path);
  }
}

}  // namespace spmd

// spmd-opt: runs the named passes, in order and nothing else, on a graph and
// prints the result as a listing (or the JSON dump), as mlir-opt does; the
// driver of the per-pass tests in tests/passes/.
#include "spmd/io/graph_json.h"
#include "spmd/io/load.h"
#include "spmd/ir/printer.h"
#include "spmd/pipelines/expected_notes.h"
#include "spmd/pipelines/flags.h"
#include "spmd/pipelines/pipelines.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <c10/util/Exception.h>

#include <iostream>

namespace {

const std::string kTool = "spmd-opt";
const std::string kSplitMarker = "// -----";

std::vector<std::string> passNames(const std::string& list) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= list.size() && !list.empty()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string name = list.substr(start, comma - start);
    if (!spmd::findPass(name)) throw spmd::Diagnostic("--passes", "unknown pass '" + name + "' (see --list-passes)");
    names.push_back(name);
    start = comma + 1;
  }
  return names;
}

// Chunks of `text` between `// -----` lines; each keeps its line numbers in
// the whole file (earlier lines become empty lines).
std::vector<std::string> splitInput(const std::string& text) {
  std::vector<std::string> chunks;
  std::string current;
  size_t lines = 0, start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    std::string line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    start = end == std::string::npos ? text.size() : end + 1;
    ++lines;
    size_t first = line.find_first_not_of(" \t");
    if (first != std::string::npos && line.compare(first, kSplitMarker.size(), kSplitMarker) == 0 &&
        line.find_first_not_of("- \t\r", first + 2) == std::string::npos) {
      chunks.push_back(current);
      current = std::string(lines, '\n');
      continue;
    }
    current += line + "\n";
  }
  chunks.push_back(current);
  return chunks;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Run the named passes on a graph and print it (listing or JSON), as mlir-opt."};
  app.footer("Examples:\n"
             "  spmd-opt --list-passes\n"
             "  spmd-opt tests/passes/bucket.spmd --passes bucket --split-input-file");
  std::string in = "-", out = "-", passes;
  std::vector<std::string> inputSpecs;
  bool json = false, split = false, verify = false;
  spmd::PipelineOptions options;
  spmd::StageFlags stageFlags;
  spmd::DebugOptions debug;
  app.add_option("IN", in, "listing, JSON graph dump, .pt2, TorchScript or artifact, '-' for stdin")->capture_default_str();
  app.add_option("-o,--output", out, "output listing (or JSON with --json), '-' for stdout")->capture_default_str();
  app.add_option("--passes", passes, "comma-separated passes to run, in order (see --list-passes)");
  app.add_flag("--json", json, "print the JSON graph dump instead of the listing");
  app.add_flag("--split-input-file", split, "run each chunk between '// -----' lines on its own");
  app.add_flag("--verify-diagnostics", verify,
               "check the notes against the input's '// expected-note@+N {{text}}' comments (a listing); exit 1 "
               "naming each note not expected and each expectation not met");
  spmd::addInputSpecFlag(app, inputSpecs);
  spmd::addStageFlags(app, options, stageFlags);
  spmd::addDebugFlags(app, debug);
  spmd::addListPassesFlag(app);

  return spmd::runTool(kTool, app, argc, argv, [&] {
    const std::vector<std::string> names = passNames(passes);
    spmd::finishStageFlags(stageFlags, options, /*optimizerRequired=*/false);
    const auto specs = spmd::parseInputSpecs(inputSpecs);
    const std::string file = spmd::displayNameOf(in);
    // One chunk: its passes run, its notes printed or, with --verify-diagnostics,
    // checked against the chunk's expectations (errors thrown as Diagnostic).
    auto runOne = [&](spmd::LoadedGraph loaded, const std::string& text) {
      spmd::DiagnosticEngine diagnostics = verify ? spmd::DiagnosticEngine() : spmd::printingDiagnostics(kTool);
      if (verify) spmd::markListingLines(loaded.graph, text);
      spmd::PipelineOptions chunkOptions = options;
      chunkOptions.diagnostics = &diagnostics;
      spmd::runStage(loaded, names, chunkOptions, debug);
      if (verify) {
        const auto unmet = spmd::unmetNoteExpectations(spmd::parseExpectedNotes(text), diagnostics.notes());
        for (size_t i = 1; i < unmet.size(); ++i) spmd::printError(kTool, file + ": " + unmet[i]);
        if (!unmet.empty()) throw spmd::Diagnostic("", unmet[0]).inFile(file);
      }
      return json ? spmd::writeGraphJson(loaded.graph) : spmd::printListing(loaded.graph);
    };
    if (!split && !verify) {
      spmd::writeOutput(out, runOne(spmd::loadGraph(in, specs), ""));
      return 0;
    }
    if (!split) {
      const std::string text = spmd::readInput(in);
      spmd::writeOutput(out, runOne(spmd::loadGraphFrom(text, file, specs), text));
      return 0;
    }
    std::string result;
    bool failed = false, first = true;
    for (const std::string& chunk : splitInput(spmd::readInput(in))) {
      if (!first) result += kSplitMarker + "\n";
      first = false;
      try {
        result += runOne(spmd::loadGraphFrom(chunk, file, specs), chunk);
        continue;
      } catch (spmd::Diagnostic& d) {
        spmd::printError(kTool, d.inFile(file).format());
      } catch (const c10::Error& e) {
        std::string what = e.what_without_backtrace();
        spmd::printError(kTool, what.substr(0, what.find('\n')));
      } catch (const std::exception& e) {
        std::string what = e.what();
        spmd::printError(kTool, what.substr(0, what.find('\n')));
      }
      failed = true;
    }
    // A failed run leaves no output file; on stdout the chunks that ran still show.
    if (!failed || out == "-") spmd::writeOutput(out, result);
    return failed ? 1 : 0;
  });
}

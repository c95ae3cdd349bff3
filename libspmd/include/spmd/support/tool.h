// The shared shape of every spmd-* front end: CLI11 parsing with usage errors
// mapped to exit 2, and every failure turned into one line on stderr
// ("<tool>: error: <file>: <where>: <what>") with exit 1. No exception escapes.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace spmd {

class DiagnosticEngine;

// The version every tool prints for --version.
const char* versionString();

// Parses argv into `app`, then runs `body`, whose return is the exit code.
int runTool(const std::string& tool, CLI::App& app, int argc, char** argv, const std::function<int()>& body);

// An engine printing each note as "<tool>: note: <file>: <where>: <what>"
// on stderr as it comes.
DiagnosticEngine printingDiagnostics(const std::string& tool);

// "<tool>: error: <message>" as one write() (lines of ranks sharing a
// terminal never interleave), on errorReportFd().
void printError(const std::string& tool, const std::string& message);

// Where error lines go: stderr, or in a rank started by spmd-run --nproc the
// pipe its launcher reads (SPMD_ERROR_FD), so that a failure is reported once.
int errorReportFd();

}  // namespace spmd

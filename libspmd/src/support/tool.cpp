#include "spmd/support/tool.h"

#include "spmd/support/diagnostic.h"
#include "spmd/support/echo.h"
#include "spmd/support/phase_times.h"
#include "spmd/support/write_all.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#ifndef SPMD_VERSION
#define SPMD_VERSION "0.0.0"
#endif

namespace spmd {

const char* versionString() { return SPMD_VERSION; }

DiagnosticEngine printingDiagnostics(const std::string& tool) {
  // One string, so one write on unbuffered stderr: lines never interleave.
  return DiagnosticEngine([tool](const Diagnostic& note) { std::cerr << (tool + ": note: " + note.format() + "\n"); });
}

int errorReportFd() {
  static const int fd = [] {
    const char* v = std::getenv("SPMD_ERROR_FD");
    if (!v || !*v) return STDERR_FILENO;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    const bool open = *end == '\0' && n > STDERR_FILENO && n < 65536 && ::fcntl(static_cast<int>(n), F_GETFD) != -1;
    return open ? static_cast<int>(n) : STDERR_FILENO;
  }();
  return fd;
}

void printError(const std::string& tool, const std::string& message) {
  std::cerr.flush();
  // One line, whatever the message holds (a value echoed whole, a newline), in one write.
  const std::string line = tool + ": error: " + oneLine(message) + "\n";
  writeAll(errorReportFd(), line.data(), line.size());
}

namespace {

// --help ends with the tool's examples (its footer) and the exit codes.
void addExitCodes(CLI::App& app) {
  const std::string examples = app.get_footer();
  app.footer(examples + (examples.empty() ? "" : "\n\n") +
             "Exit codes:\n"
             "  0  success\n"
             "  1  failure: one line on stderr, <tool>: error: <file>: <where>: <what>\n"
             "  2  usage error (a flag unknown or malformed)");
}

// Whether what the tool printed on stdout got out: a full disk or /dev/full
// loses it, and the exit status must say so (issue 57).
bool stdoutWritten(const std::string& tool) {
  std::cout.flush();
  errno = 0;
  const bool failed = std::cout.fail() || std::fflush(stdout) != 0 || std::ferror(stdout);
  if (!failed) return true;
  const int error = errno;
  printError(tool, std::string("<stdout>: cannot write: ") + (error ? std::strerror(error) : "a write failed (a full disk?)"));
  return false;
}

// A tool whose IN defaults to stdin, started on a terminal with no input:
// refused, rather than waiting silently for the user to type a graph.
bool waitsOnTerminal(CLI::App& app) {
  const CLI::Option* in = app.get_option_no_throw("IN");
  return in && in->count() == 0 && ::isatty(STDIN_FILENO);
}

}  // namespace

int runTool(const std::string& tool, CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  app.set_version_flag("--version", std::string(tool) + " " + versionString());
  addExitCodes(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::Success&) {  // a flag such as --list-passes did its work
    return 0;
  } catch (const CLI::ParseError& e) {
    printError(tool, e.what());
    std::cerr << "Run with --help for more information." << std::endl;
    return 2;
  }
  if (waitsOnTerminal(app)) {
    printError(tool, "no input: IN is stdin, a terminal; name a file, pipe one in, or give '-' to type it");
    return 2;
  }
  try {
    const int status = body();
    printPhaseTimes(std::cerr);  // --time-passes
    return status == 0 && !stdoutWritten(tool) ? 1 : status;
  } catch (const Diagnostic& d) {
    printError(tool, d.format());
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    printError(tool, what.substr(0, what.find('\n')));
  } catch (const std::exception& e) {
    std::string what = e.what();
    printError(tool, what.substr(0, what.find('\n')));
  }
  return 1;
}

}  // namespace spmd

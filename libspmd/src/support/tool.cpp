#include "spmd/support/tool.h"

#include "spmd/support/diagnostic.h"
#include "spmd/support/echo.h"

#include <c10/util/Exception.h>

#include <iostream>

#ifndef SPMD_VERSION
#define SPMD_VERSION "0.0.0"
#endif

namespace spmd {

const char* versionString() { return SPMD_VERSION; }

DiagnosticEngine printingDiagnostics(const std::string& tool) {
  return DiagnosticEngine([tool](const Diagnostic& note) { std::cerr << tool << ": note: " << note.format() << "\n"; });
}

void printError(const std::string& tool, const std::string& message) {
  // One line, whatever the message holds (a value echoed whole, a newline).
  std::cerr << tool << ": error: " << oneLine(message) << std::endl;
}

int runTool(const std::string& tool, CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  app.set_version_flag("--version", std::string(tool) + " " + versionString());
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
  try {
    return body();
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

// A model given as Python (spmd-train's [model] module and function): the
// function builds the model and an example batch, and python3's torch.export
// writes the program spmd-expand reads.
#pragma once

#include <string>

namespace spmd {

struct PythonModel {
  std::string module;    // a .py file
  std::string function;  // its function: () -> (nn.Module, args tuple or dict of keyword arguments)
  std::string python = "python3";
};

// Runs `python` on an export script: imports `module` from its file, calls
// `function`, exports the model on its example inputs with torch.export and
// saves the program to `out` (written beside it, renamed into place). A
// failure (no such file or function, a Python error, torch.export refusing
// the model) is a Diagnostic whose text is the script's one line: the user's
// file and line where the error was raised there.
void exportPythonModel(const PythonModel& model, const std::string& out);

}  // namespace spmd

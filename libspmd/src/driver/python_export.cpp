#include "spmd/driver/python_export.h"

#include "spmd/io/output_file.h"
#include "spmd/support/diagnostic.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace spmd {
namespace {

// Imports the module from its file, calls the function, exports and saves.
// Every failure is one line on stderr (the user's file and line where the
// error came from there), exit 1: never a traceback.
const char* kExportScript = R"PY(
import importlib.util, os, sys, traceback
path, function, out = sys.argv[1:4]

def fail(text):
    sys.stderr.write(" ".join(str(text).split()) + "\n")
    sys.exit(1)

try:
    import torch
except Exception as e:
    fail(f"{sys.executable} cannot import torch: {e}")
if not os.path.isfile(path):
    fail(f"{path}: no such file")
try:
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location("spmd_train_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    build = getattr(module, function, None)
    if not callable(build):
        fail(f"{path}: no function '{function}'")
    made = build()
    if not (isinstance(made, (tuple, list)) and len(made) == 2 and isinstance(made[0], torch.nn.Module)):
        fail(f"{path}: {function}() must return (model, example_inputs): an nn.Module whose forward returns the "
             "loss, and a tuple of its arguments (or a dict of keyword arguments)")
    model, example = made
    args, kwargs = (example, {}) if isinstance(example, (tuple, list)) else \
        ((), example) if isinstance(example, dict) else ((example,), {})
    program = torch.export.export(model, tuple(args), kwargs)
    torch.export.save(program, out)
except SystemExit:
    raise
except BaseException as e:
    mine = [f for f in traceback.extract_tb(e.__traceback__) if os.path.abspath(f.filename) == os.path.abspath(path)]
    where = f"{path}:{mine[-1].lineno}: " if mine else f"{path}: "
    text = str(e).strip().splitlines()
    fail(where + type(e).__name__ + (": " + text[0] if text else ""))
)PY";

struct Finished {
  int status = 0;
  std::string err;
};

// Runs argv with stdout to /dev/null and stderr read back.
Finished runCapturingStderr(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe(fds) != 0) throw Diagnostic("", std::string("cannot start python: ") + std::strerror(errno));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw Diagnostic("", std::string("cannot start python: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    std::FILE* devnull = std::fopen("/dev/null", "w");
    if (devnull) ::dup2(fileno(devnull), STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execvp(args[0], args.data());
    const std::string why = std::string(args[0]) + ": cannot run it: " + std::strerror(errno) + "\n";
    (void)!::write(STDERR_FILENO, why.data(), why.size());
    ::_exit(127);
  }
  ::close(fds[1]);
  Finished f;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0 && f.err.size() < (1 << 20)) f.err.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  while (::waitpid(pid, &f.status, 0) < 0 && errno == EINTR) {
  }
  return f;
}

std::string lastLine(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const size_t at = text.rfind('\n');
  return at == std::string::npos ? text : text.substr(at + 1);
}

}  // namespace

void exportPythonModel(const PythonModel& model, const std::string& out) {
  const std::string temp = temporaryBeside(out, ".tmp-");
  const Finished f = runCapturingStderr({model.python, "-c", kExportScript, model.module, model.function, temp});
  const bool ok = WIFEXITED(f.status) && WEXITSTATUS(f.status) == 0;
  if (!ok) {
    std::remove(temp.c_str());
    std::string why = lastLine(f.err);
    if (why.empty()) why = model.python + " exited with status " + std::to_string(f.status);
    throw Diagnostic("", "exporting " + model.module + "'s " + model.function + "(): " + why);
  }
  if (std::rename(temp.c_str(), out.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(temp.c_str());
    throw Diagnostic("", "cannot write " + out + ": " + why);
  }
}

}  // namespace spmd

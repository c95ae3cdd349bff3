# lit configuration of the per-pass tests: each <pass>.spmd holds small graph
# listings, `// RUN:` lines that run spmd-opt on them and FileCheck lines that
# check the result. Build paths come from lit.site.cfg.py (CMake writes it).
import os
import re
import sys

import lit.formats

config.name = "spmd-passes"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".spmd", ".test"]
config.excludes = ["lit.cfg.py", "lit.site.cfg.py.in", "check_coverage.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = getattr(config, "spmd_exec_root", os.path.join(config.test_source_root, "Output"))

tools = {
    "spmd-opt": getattr(config, "spmd_opt", None),
    "spmd-inspect": getattr(config, "spmd_inspect", None),
    "FileCheck": getattr(config, "filecheck", None),
    "not": getattr(config, "not_tool", None),
}
for name, path in tools.items():
    # A missing tool fails the whole suite rather than skipping it.
    if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
        lit_config.fatal(f"{name} not found (got {path!r}); install llvm-19-tools and build spmd-opt and spmd-inspect")
    # The tool's name as a word of a RUN line, not inside a path or a longer name.
    config.substitutions.append((r"(?<![\w./-])" + re.escape(name) + r"(?![\w./-])", path))
config.substitutions.append(("%torch_python", getattr(config, "torch_python", "/usr/bin/python3")))
config.substitutions.append(("%python", sys.executable))

config.environment["LC_ALL"] = "C"

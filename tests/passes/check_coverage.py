"""Every registered pass has its test file: reads `spmd-opt --list-passes`
on stdin and fails naming each pass without tests/passes/<pass>.spmd."""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
passes = [line.split()[0] for line in sys.stdin if line.strip()]
if not passes:
    sys.exit("no passes listed")
missing = [p for p in passes if not os.path.isfile(os.path.join(here, p + ".spmd"))]
for p in missing:
    print(f"no test file tests/passes/{p}.spmd for pass {p}")
print(f"{len(passes) - len(missing)} of {len(passes)} passes have a test file")
sys.exit(1 if missing else 0)

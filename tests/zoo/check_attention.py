"""Every F.scaled_dot_product_attention call in the zoo's models becomes
spmd::attention (issue 39): for each model gen_zoo.py wrote, the SDPA calls
of its imported graph (spmd-inspect) are counted, and spmd-expand's step must
hold as many spmd::attention nodes of the SDPA form (sdpa True), with no
SDPA call and no piece of SDPA's math (_safe_softmax) left.

  check_attention.py BIN_DIR ZOO_DIR
"""
import glob
import os
import re
import subprocess
import sys


def listing(bin_dir, model, inputs, expand):
    words = open(inputs).read().split()
    if expand:
        step = subprocess.run([os.path.join(bin_dir, "spmd-expand"), model, *words, "--optimizer", "sgd", "--lr",
                               "0.01"], capture_output=True, check=True).stdout
        return subprocess.run([os.path.join(bin_dir, "spmd-inspect"), "-"], input=step, capture_output=True,
                              check=True).stdout.decode()
    return subprocess.run([os.path.join(bin_dir, "spmd-inspect"), model, *words], capture_output=True,
                          check=True).stdout.decode()


def main():
    bin_dir, zoo = sys.argv[1], sys.argv[2]
    failures, calls = 0, 0
    for model in sorted(glob.glob(os.path.join(zoo, "*.pt"))):
        name = os.path.basename(model)[:-3]
        inputs = model[:-3] + ".inputs"
        if not os.path.exists(inputs):
            continue
        imported = len(re.findall(r"= aten::scaled_dot_product_attention\(", listing(bin_dir, model, inputs, False)))
        if imported == 0:
            continue
        step = listing(bin_dir, model, inputs, True)
        taken = len(re.findall(r"= spmd::attention\((?:[^,]*, ){8}True,", step))
        left = "aten::scaled_dot_product_attention" in step or "_safe_softmax" in step
        ok = taken == imported and not left
        failures += 0 if ok else 1
        calls += imported
        print(f"{'PASS' if ok else 'FAIL'} {name}: {imported} SDPA call(s), {taken} spmd::attention"
              + (", SDPA's math left in the step" if left else ""))
    if calls == 0:
        print("FAIL no zoo model calls SDPA: is ZOO_DIR gen_zoo.py's?")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

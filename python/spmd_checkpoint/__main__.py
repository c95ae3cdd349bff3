"""python3 -m spmd_checkpoint merge DIR OUT

DIR is the --checkpoint folder of a run whose step was sharded (spmd-split
--shard): its index.json and one rank-KKKKK folder per rank. merge joins the
newest step every rank holds whole into the folder OUT, as one rank would
have written it: model.pt ({name: tensor}, model.load_state_dict reads it),
optimizer.pt (torch.optim's state_dict() layout with whole tensors,
optimizer.load_state_dict reads it), extra.pt and manifest.json (rank 0's, without its members' digests).
spmd-run --resume-weights-only takes OUT's weights into any step of the model.
Before it writes, merge checks every rank's members against their CRC-32s and the
digests their manifests hold, and each rank's manifest against its folder's step,
index.json's world size and rank 0's fingerprint and seed.

Every failure is one line on stderr, `spmd_checkpoint: error: ...`, with exit
status 1 (2 for a bad command line), never a traceback.
"""
import argparse
import sys

from ._merge import MergeError, merge


def main(argv=None):
    p = argparse.ArgumentParser(prog="spmd_checkpoint", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="join a sharded checkpoint's ranks into one checkpoint folder")
    m.add_argument("dir", metavar="DIR", help="spmd-run's --checkpoint folder of a sharded step")
    m.add_argument("out", metavar="OUT", help="the folder to write (must not exist)")
    a = p.parse_args(argv)
    try:
        step = merge(a.dir, a.out)
    except MergeError as e:
        print(f"spmd_checkpoint: error: {e}", file=sys.stderr)
        return 1
    print(f"merged step {step} of {a.dir} into {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

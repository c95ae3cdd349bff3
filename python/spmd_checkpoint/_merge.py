"""Joining the ranks of a sharded checkpoint (runtime/checkpoint.h).

Rank r's optimizer.pt holds shard r of each parameter's state: its dim-0
rows [r * k, (r + 1) * k), k = ceil(rows / world), the last shard padded with
zero rows (a 0-dim parameter counts as one row): passes/shard.cpp. model.pt
holds whole parameters on every rank, or (when the index says the ranks hold
shards) rank r's shards.
"""
import json
import os
import shutil
import tempfile

import torch

FORMAT = "spmd-sharded-checkpoint"


class MergeError(Exception):
    pass


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise MergeError(f"{path}: {e.strerror}")
    except ValueError as e:
        raise MergeError(f"{path}: damaged JSON: {e}")


def _load(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise MergeError(f"{path}: missing")
    except Exception as e:  # torch.load's own errors: a damaged file
        raise MergeError(f"{path}: cannot be read: {str(e).splitlines()[0]}")


def _whole_steps(rank_dir):
    steps = set()
    for name in os.listdir(rank_dir):
        if name.startswith("step-") and name[5:].isdigit() and os.path.exists(os.path.join(rank_dir, name,
                                                                                              "manifest.json")):
            steps.add(int(name[5:]))
    return steps


def _unshard(pieces, shape, where):
    """The whole tensor of `shape` from every rank's dim-0 shard."""
    rows = shape[0] if shape else 1
    joined = torch.cat([p.reshape(p.shape[0] if p.dim() else 1, -1) for p in pieces], 0)
    if joined.shape[0] < rows:
        raise MergeError(f"{where}: the shards hold {joined.shape[0]} rows, the parameter has {rows}")
    return joined[:rows].reshape(shape)


def merge(root, out):
    """Writes the newest common step of `root` into the folder `out`; returns the step."""
    index = _read_json(os.path.join(root, "index.json"))
    if index.get("format") != FORMAT:
        raise MergeError(f"{os.path.join(root, 'index.json')}: not an spmd sharded checkpoint index")
    world = index["world_size"]
    params = [(name, list(shape)) for name, shape in index["parameters"]]
    rank_dirs = [os.path.join(root, r) for r in index["ranks"]]
    if len(rank_dirs) != world:
        raise MergeError(f"{root}/index.json: {len(rank_dirs)} rank folders for {world} ranks")
    common = None
    for d in rank_dirs:
        if not os.path.isdir(d):
            raise MergeError(f"{d}: missing")
        common = _whole_steps(d) if common is None else common & _whole_steps(d)
    if not common:
        raise MergeError(f"{root}: no step that every rank's folder holds whole")
    step = max(common)
    folders = [os.path.join(d, f"step-{step:08d}") for d in rank_dirs]
    if os.path.exists(out):
        raise MergeError(f"{out}: exists already")

    models = [_load(os.path.join(f, "model.pt")) for f in folders]
    optimizers = [_load(os.path.join(f, "optimizer.pt")) for f in folders]
    model = dict(models[0])
    for name, shape in params:
        if list(model[name].shape) != shape:  # the ranks hold shards of it
            model[name] = _unshard([m[name] for m in models], shape, f"model.pt '{name}'")
    state = {}
    for idx, fields in optimizers[0]["state"].items():
        name, shape = params[idx]
        state[idx] = {}
        for key, value in fields.items():
            if key == "step":
                state[idx][key] = value
            else:
                state[idx][key] = _unshard([o["state"][idx][key] for o in optimizers], shape,
                                           f"optimizer.pt '{name}' {key}")
    optimizer = {"state": state, "param_groups": optimizers[0]["param_groups"]}

    parent = os.path.dirname(os.path.abspath(out))
    temp = tempfile.mkdtemp(prefix=".merge-", dir=parent)
    try:
        torch.save(model, os.path.join(temp, "model.pt"))
        torch.save(optimizer, os.path.join(temp, "optimizer.pt"))
        shutil.copyfile(os.path.join(folders[0], "extra.pt"), os.path.join(temp, "extra.pt"))
        # Rank 0's manifest without its members' digests: model.pt and optimizer.pt
        # here are the merged ones, not rank 0's shards.
        with open(os.path.join(folders[0], "manifest.json")) as f:
            manifest = json.load(f)
        manifest.pop("digests", None)
        with open(os.path.join(temp, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
            f.write("\n")
        os.rename(temp, out)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return step

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
import zipfile

import torch

FORMAT = "spmd-sharded-checkpoint"
MEMBERS = ("model.pt", "optimizer.pt", "extra.pt")


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


def _index(root):
    """index.json's world size, parameters [(name, shape)] and rank folders, each checked."""
    path = os.path.join(root, "index.json")
    index = _read_json(path)
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise MergeError(f"{path}: not an spmd sharded checkpoint index")
    try:
        world = index["world_size"]
        params = [(name, [int(d) for d in shape]) for name, shape in index["parameters"]]
        ranks = list(index["ranks"])
    except KeyError as e:
        raise MergeError(f"{path}: no {e.args[0]!r}")
    except (TypeError, ValueError):
        raise MergeError(f"{path}: 'parameters' is not a list of [name, shape] and 'ranks' a list of folder names")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise MergeError(f"{path}: 'world_size' is not a positive integer")
    if not all(isinstance(r, str) and r and "/" not in r for r in ranks):
        raise MergeError(f"{path}: 'ranks' is not a list of folder names")
    return world, params, [os.path.join(root, r) for r in ranks]


def _zip_digest(path):
    """runtime/checkpoint.cpp's zipDigest: FNV-1a (64 bits) over each zip member's name, size and
    CRC-32 from the central directory, each followed by a 0xff separator."""
    h, prime, mask = 1469598103934665603, 1099511628211, (1 << 64) - 1

    def mix(text):
        nonlocal h
        for c in text.encode() + b"\xff":
            h = ((h ^ c) * prime) & mask

    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            mix(info.filename)
            mix(str(info.file_size))
            mix(str(info.CRC))
    return "%016x" % h


def _check_members(folder, manifest):
    """Every member file whole (each zip member against its CRC-32) and, where the manifest
    holds its digest, the file the manifest was written with."""
    digests = manifest.get("digests", {}) if isinstance(manifest, dict) else {}
    for name in MEMBERS:
        path = os.path.join(folder, name)
        try:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
        except FileNotFoundError:
            raise MergeError(f"{path}: missing")
        except (OSError, zipfile.BadZipFile, EOFError) as e:
            raise MergeError(f"{path}: not a whole zip file: {e}")
        if bad is not None:
            raise MergeError(f"{path}: damaged: member '{bad}' does not match its CRC-32")
        if name in digests and _zip_digest(path) != digests[name]:
            raise MergeError(f"{path}: is not the file its manifest.json was written with: a file of another "
                             f"step or run")


def _check_manifests(folders, step, world):
    """Each rank's manifest names the step of its folder, and every rank's the same run."""
    first = None
    for rank, folder in enumerate(folders):
        path = os.path.join(folder, "manifest.json")
        manifest = _read_json(path)
        if not isinstance(manifest, dict):
            raise MergeError(f"{path}: not a checkpoint manifest")
        # Written by spmd-run since issue 57: the rank whose shards the folder holds.
        if "rank" in manifest and manifest["rank"] != rank:
            raise MergeError(f"{path}: holds rank {manifest['rank']!r}'s shards, not rank {rank}'s: the rank "
                             f"folders were swapped or copied")
        if manifest.get("step") != step or isinstance(manifest.get("step"), bool):
            raise MergeError(f"{path}: step {manifest.get('step')!r}, but the folder is step-{step:08d}")
        if manifest.get("world_size") != world:
            raise MergeError(f"{path}: world_size {manifest.get('world_size')!r}, index.json's {world}")
        if first is None:
            first = manifest
        else:
            for key in ("fingerprint", "seed"):
                if manifest.get(key) != first.get(key):
                    raise MergeError(f"{path}: {key} {manifest.get(key)!r}, rank 0's {first.get(key)!r}: "
                                     f"the ranks' folders are of different runs")
        _check_members(folder, manifest)


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
    world, params, rank_dirs = _index(root)
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
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise MergeError(f"{out}: its folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise MergeError(f"{out}: its folder {parent} is not writable")
    _check_manifests(folders, step, world)

    try:
        model, optimizer = _joined(folders, params)
    except (KeyError, IndexError, TypeError, AttributeError, RuntimeError) as e:
        raise MergeError(f"{root}: the ranks' files do not hold what index.json lists ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})")
    try:
        temp = tempfile.mkdtemp(prefix=".merge-", dir=parent)
    except OSError as e:
        raise MergeError(f"{out}: cannot create a folder beside it: {e.strerror}")
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
    except (OSError, RuntimeError) as e:  # a full disk, say: nothing of OUT is left
        shutil.rmtree(temp, ignore_errors=True)
        raise MergeError(f"{out}: cannot be written: {getattr(e, 'strerror', None) or str(e).splitlines()[0]}")
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return step


def _joined(folders, params):
    """(model, optimizer state_dict) of the whole parameters from every rank's files."""
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
    return model, optimizer

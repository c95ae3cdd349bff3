"""Sharded checkpoints of spmd-run (spmd-split --shard): joined into one."""
from ._merge import MergeError, merge

__all__ = ["MergeError", "merge"]

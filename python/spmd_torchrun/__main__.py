"""python3 -m spmd_torchrun ARGS: torchrun with ARGS, its stores' libuv as USE_LIBUV says."""
from . import patch_tcp_store

patch_tcp_store()

from torch.distributed.run import main  # noqa: E402

main()

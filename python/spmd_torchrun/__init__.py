"""torchrun for a torch built without libuv (Debian's): ``python3 -m spmd_torchrun ARGS``.

torchrun's rendezvous opens c10d TCPStores without saying which server to use,
and LibTorch's default (libuv) is refused by a torch built without it, whatever
USE_LIBUV says: "use_libuv was requested but PyTorch was build without libuv
support". This module gives those stores USE_LIBUV's choice and, where this
torch refuses libuv, the classic server (the same protocol to every client),
as spmd-run's own store does; then it runs torch.distributed.run's main with
the same arguments, so every torchrun flag, rendezvous backend and elastic
behaviour is torchrun's own. On a torch with libuv it changes nothing.
"""
import os

import torch.distributed as dist


def patch_tcp_store():
    """TCPStore(...) without use_libuv: USE_LIBUV's choice (default on), the classic server where libuv is refused."""
    original = dist.TCPStore
    wanted = os.environ.get("USE_LIBUV", "1") == "1"

    class TCPStore(original):
        def __init__(self, *args, **kwargs):
            if "use_libuv" in kwargs:
                super().__init__(*args, **kwargs)
                return
            try:
                super().__init__(*args, use_libuv=wanted, **kwargs)
            except RuntimeError as e:
                if not wanted or "libuv" not in str(e):
                    raise
                super().__init__(*args, use_libuv=False, **kwargs)

    dist.TCPStore = TCPStore
    import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c10d_backend
    import torch.distributed.elastic.rendezvous.dynamic_rendezvous as dynamic
    import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as static
    import torch.distributed.rendezvous as rendezvous
    for module in (c10d_backend, static, dynamic, rendezvous):
        if getattr(module, "TCPStore", None) is original:
            module.TCPStore = TCPStore

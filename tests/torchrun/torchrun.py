"""PyTorch's own torchrun (torch.distributed.run), for checking that fsdpp programs run under it.

Debian's python3-torch 1.13 on Python 3.11 could not parse torchrun's default "--redirects 0"
(Std.from_str("0") returned None: Python 3.11 no longer yields the zero-valued flag when iterating
an IntFlag); this shim maps "0" to Std.NONE, harmless on 2.x, and otherwise runs torchrun unchanged.
PyTorch 2.x's TCPStore defaults to a libuv backend that Debian's build lacks ("use_libuv was
requested but PyTorch was build without libuv support"): USE_LIBUV=0 covers the workers'
init_process_group, and the agent's own store (static rendezvous) is made with use_libuv=False.
"""
import functools
import os
import sys

import torch

from torch.distributed.elastic.multiprocessing import api
from torch.distributed import run

_from_str = api.Std.from_str.__func__


def _fixed_from_str(cls, vm):
    return cls.NONE if vm == "0" else _from_str(cls, vm)


api.Std.from_str = classmethod(_fixed_from_str)

if int(torch.__version__.split(".")[0]) >= 2:
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous

    static_tcp_rendezvous.TCPStore = functools.partial(static_tcp_rendezvous.TCPStore, use_libuv=False)

if __name__ == "__main__":
    os.environ.setdefault("USE_LIBUV", "0")
    sys.exit(run.main())

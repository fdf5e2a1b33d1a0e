"""init_process_group("gloo") for the Python anchors, on PyTorch 2.x (Debian's 2.6 and PyPI's 2.15).

PyTorch 2.x's TCPStore defaults to a libuv backend that Debian's build lacks, and the client a
rank makes of torchrun's agent store ignores USE_LIBUV; so on 2.x every store is made with
use_libuv=False here (the classic backend speaks the same protocol).
"""
import functools
import importlib

import torch
import torch.distributed as dist


def init_process_group():
    if int(torch.__version__.split(".")[0]) >= 2:
        # the module, not torch.distributed.rendezvous the function that shadows it
        rendezvous = importlib.import_module("torch.distributed.rendezvous")
        rendezvous.TCPStore = functools.partial(rendezvous.TCPStore, use_libuv=False)
    dist.init_process_group("gloo")

"""PyTorch's own torchrun (torch.distributed.run), for checking that fsdpp programs run under it.

Debian's python3-torch 1.13 on Python 3.11 cannot parse torchrun's default "--redirects 0":
Std.from_str("0") returns None, because Python 3.11 no longer yields the zero-valued flag when
iterating an IntFlag. This shim maps "0" to Std.NONE and otherwise runs torchrun unchanged.
"""
import sys

from torch.distributed.elastic.multiprocessing import api
from torch.distributed import run

_from_str = api.Std.from_str.__func__


def _fixed_from_str(cls, vm):
    return cls.NONE if vm == "0" else _from_str(cls, vm)


api.Std.from_str = classmethod(_fixed_from_str)

if __name__ == "__main__":
    sys.exit(run.main())

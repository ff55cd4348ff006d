"""The first call of a torch.compile'd model, timed as the GPU benches report
it: from a synchronized start to a synchronized end, so the compile and the
kernels it launched are in, and nothing queued before."""

import time

import torch


def timed_first_call(call, *args):
    """(call(*args), its seconds)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = call(*args)
    torch.cuda.synchronize()
    return out, time.perf_counter() - start

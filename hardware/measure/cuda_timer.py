"""One timer for the device checks of hardware/measure: the mean wall time of a CUDA callable.

time_s = (CUDA event elapsed over `repeats` calls) / repeats, after `warmup` untimed calls and a
synchronize, so neither launch queues nor lazy initialisation count. Imported by the scripts
beside it (run as `python hardware/measure/NAME.py`, which puts this folder on sys.path).
"""

from __future__ import annotations


def time_s(fn, repeats: int = 50, warmup: int = 5) -> float:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats

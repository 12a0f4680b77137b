"""Tensors on several CUDA GPUs: the NCCL all-reduce (glassgrad/runtime/nccl.py) and a data-parallel step.

Skipped unless CUDA answers and `nccl4py` imports (`pip install 'glassgrad[multigpu]'`). With one GPU, a world-size-1
all-reduce must return its input; with two or more, a real two-GPU all-reduce and a data-parallel training step
must match one GPU."""
from __future__ import annotations

import numpy as np
import pytest

from glassgrad.device import Buffer
from glassgrad.dtype import dtypes
from glassgrad.uop.ops import Ops


def _gpu_count() -> int:
    try:
        from glassgrad.runtime.ops_cuda import _init_driver
        return _init_driver()
    except Exception:
        return 0


def _nccl() -> bool:
    from glassgrad.runtime.nccl import nccl_available
    return nccl_available()


GPUS = _gpu_count()
pytestmark = pytest.mark.skipif(GPUS < 1 or not _nccl(), reason="needs a CUDA GPU and nccl4py")


def test_world_size_one_allreduce_is_identity() -> None:
    from glassgrad.runtime.nccl import nccl_allreduce
    data = np.arange(1000, dtype=np.float32)
    src, dest = Buffer("CUDA", 1000, dtypes.float32).copyin(data), Buffer("CUDA", 1000, dtypes.float32)
    nccl_allreduce(Ops.ADD, [src], [dest])
    np.testing.assert_array_equal(dest.numpy(), data)


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
def test_two_gpu_allreduce() -> None:
    from glassgrad.engine.collectives import allreduce
    devices = ("CUDA:0", "CUDA:1")
    ins = [Buffer(d, 4096, dtypes.float32).copyin(np.full(4096, i + 1, np.float32)) for i, d in enumerate(devices)]
    outs = [Buffer(d, 4096, dtypes.float32) for d in devices]
    allreduce(Ops.ADD, ins, outs)
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), np.full(4096, 3, np.float32))


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
def test_two_gpu_data_parallel_step_matches_one() -> None:
    import glassgrad.device as device
    from glassgrad.nn.optim import Adam
    from tests.test_multi import _train
    old = device.Device.DEFAULT
    device.Device.DEFAULT = "CUDA"
    try:
        want = _train(None, Adam)
        got = _train(("CUDA:0", "CUDA:1"), Adam)
        jitted = _train(("CUDA:0", "CUDA:1"), Adam, jit=True)
    finally:
        device.Device.DEFAULT = old
    np.testing.assert_allclose(got, want, rtol=1e-4)
    np.testing.assert_allclose(jitted, want, rtol=1e-4)

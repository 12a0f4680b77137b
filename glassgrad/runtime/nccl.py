"""NCCL collectives between the CUDA GPUs of this process, through `nccl4py` (an optional extra: `[multigpu]`).

In: n buffers on n distinct CUDA devices (and n outputs). Out: `ncclAllReduce` on each GPU, issued in one NCCL group
on the legacy default stream, the stream every glassgrad kernel, copy and graph of that GPU runs on: the collective
starts after the kernels that wrote its inputs and before the ones that read its outputs, without a host sync.

One communicator per ordered device set (`ncclCommInitAll` over their GPU indices; rank i is the i-th device),
created on first use and kept for the life of the process. `nccl4py` is imported on first use only, so glassgrad
imports without it; `nccl_available()` says whether it can be used.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from glassgrad.device import Buffer, Device
from glassgrad.dtype import DType, dtypes
from glassgrad.uop.ops import Ops

# ncclDataType_t and ncclRedOp_t values (nccl.h; nccl4py's NcclDataType / NcclRedOp)
_NCCL_DTYPE: dict[DType, int] = {dtypes.int8: 0, dtypes.uint8: 1, dtypes.int32: 2, dtypes.uint32: 3, dtypes.int64: 4,
                                 dtypes.uint64: 5, dtypes.float16: 6, dtypes.float32: 7, dtypes.float64: 8,
                                 dtypes.bfloat16: 9, dtypes.bool: 1}
_NCCL_OP = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: 2}
LEGACY_DEFAULT_STREAM = 0  # the stream ops_cuda launches on


@functools.cache
def _bindings() -> Any:
    from nccl.bindings import nccl  # type: ignore[import-not-found]  # the optional extra
    return nccl


def nccl_available() -> bool:
    try:
        _bindings()
    except Exception:
        return False
    return True


def _gpu_index(device: str) -> int:
    return int(device.partition(":")[2] or 0)


@functools.cache
def communicators(devices: tuple[str, ...]) -> list[Any]:
    """One communicator per device of the set (rank i on devices[i]), made once per set."""
    for d in devices:
        Device[d]  # open every context first (NCCL uses the primary contexts)
    return list(_bindings().comm_init_all(len(devices), [_gpu_index(d) for d in devices]))


def nccl_allreduce(op: Ops, inputs: Sequence[Buffer], outputs: Sequence[Buffer]) -> None:
    """outputs[i] = reduction of all inputs, one ncclAllReduce per GPU in one group."""
    nccl = _bindings()
    dtype = inputs[0].dtype
    if dtype not in _NCCL_DTYPE or (dtype == dtypes.bool and op is not Ops.MAX):
        raise NotImplementedError(f"NCCL all-reduce of {dtype} with {op}")
    comms = communicators(tuple(b.device for b in inputs))
    count = inputs[0].size * (dtype.itemsize if dtype == dtypes.bool else 1)
    nccl.group_start()
    try:
        for comm, src, dest in zip(comms, inputs, outputs):
            Device[src.device].allocator.ctx.activate()  # type: ignore[attr-defined]  # a CUDAAllocator
            nccl.all_reduce(int(src.handle), int(dest.handle), count, _NCCL_DTYPE[dtype], _NCCL_OP[op], comm,
                            LEGACY_DEFAULT_STREAM)
    finally:
        nccl.group_end()

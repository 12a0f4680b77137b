"""Collectives: an all-reduce over one buffer per device.

In: n input buffers and n output buffers of one size and dtype, one of each on each of n devices, and the reduce op
(ADD, MAX, MUL). Out: every output holds the elementwise reduction of all the inputs.

Two ways, chosen per call:
  * NCCL (`glassgrad/runtime/nccl.py`), when every device is a CUDA GPU, the n GPUs are distinct and `nccl4py`
    imports: one `ncclAllReduce` per GPU in one group, on the stream the kernels use (ordered with them), through a
    communicator per device set created once;
  * the host otherwise (CPU devices, or no NCCL): the inputs are copied to the host, reduced with numpy in device
    order, and copied into every output. On `CPU:0`/`CPU:1` this runs the same schedules as on GPUs, so the sharding
    logic is tested without one.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from glassgrad.device import Buffer
from glassgrad.dtype import bf16_to_f32, dtypes, f32_to_bf16
from glassgrad.helpers import getenv
from glassgrad.uop.ops import Ops

_NUMPY_REDUCE = {Ops.ADD: np.add, Ops.MAX: np.maximum, Ops.MUL: np.multiply}


def allreduce(op: Ops, inputs: Sequence[Buffer], outputs: Sequence[Buffer]) -> None:
    """outputs[i] = op-reduction of every input, for every i."""
    if op not in _NUMPY_REDUCE:
        raise ValueError(f"allreduce: unsupported reduce op {op}; ADD, MAX and MUL are")
    if len(inputs) != len(outputs) or any(b.size != inputs[0].size or b.dtype != inputs[0].dtype
                                           for b in (*inputs, *outputs)):
        raise ValueError(f"allreduce needs one input and one output per device, of one size and dtype: "
                         f"{list(inputs)} -> {list(outputs)}")
    if _use_nccl(inputs, outputs):
        from glassgrad.runtime.nccl import nccl_allreduce
        nccl_allreduce(op, inputs, outputs)
        return
    host_allreduce(op, inputs, outputs)


def host_allreduce(op: Ops, inputs: Sequence[Buffer], outputs: Sequence[Buffer]) -> None:
    """Through the host: reduce the inputs' contents in device order, write the result into every output."""
    arrays = [b.numpy() for b in inputs]
    if inputs[0].dtype == dtypes.bfloat16:  # stored as its bits: reduce the float32 values, round once
        result = f32_to_bf16(_reduce(op, [bf16_to_f32(a) for a in arrays]))
    else:
        result = _reduce(op, arrays).astype(arrays[0].dtype, copy=False)
    for out in outputs:
        out.copyin(result)


def _reduce(op: Ops, arrays: list[np.ndarray]) -> np.ndarray:
    result = arrays[0].copy()
    for a in arrays[1:]:
        if a.dtype == np.bool_:
            result = result | a if op is not Ops.MUL else result & a
        else:
            _NUMPY_REDUCE[op](result, a, out=result)
    return result


def _use_nccl(inputs: Sequence[Buffer], outputs: Sequence[Buffer]) -> bool:
    devices = [b.device for b in inputs]
    if getenv("NCCL", 1) == 0 or not all(d.split(":")[0] == "CUDA" for d in devices):
        return False
    if len(set(devices)) != len(devices) or [b.device for b in outputs] != devices:
        return False
    from glassgrad.runtime.nccl import nccl_available
    return nccl_available()

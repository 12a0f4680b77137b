"""Scatters: one-hot sums over the positions an index names become scatter-adds (a tensor-graph rewrite the scheduler
runs before fusion, after the gathers of schedule/gather.py).

In: a REDUCE_AXIS of the unmaterialised tensor graph. Out: a `SCATTER` node equal to it, or None.

The backward of a lookup (`embedding`, `gather`, advanced indexing) is, on the tensor graph, a one-hot sum over the
*tokens*:

    dW[v, d] = sum_t where(a[t] == v, g[t, d], 0)

a REDUCE_AXIS(ADD) over t of a WHERE whose condition compares an index that varies along the reduced axes with an
arange along a *kept* axis v. That is O(V*T*D) work (every token compared with every row); the same sum is

    dW = 0;  for every (t, d): if 0 <= a[t] < V: dW[a[t], d] += g[t, d]          (SCATTER: O(T*D))

The rule (`scatter_one_hot`) matches REDUCE_AXIS(ADD, reduced axes) of WHERE(cond, x, 0) where `cond` is an AND of
terms (movement ops pushed down onto each, as for gathers) of which one, for a kept axis v longer than 1, is
CMPEQ(a, q) with q equal to v's index (an arange along v) and a independent of every axis selected this way. It is
decided with gather.py's machinery, on the kernel expressions the KernelBuilder makes at fresh loop indices. The
other AND terms stay in the value, `x' = where(rest, x, 0)`, evaluated at the selected element.

    SCATTER(x', a_1, ..., a_m) arg=((v_1, ..., v_m), reduced axes): the reduction's output shape;
    out = 0; for every index o of x' with the axes v_i at 0: if every a_i[o] is in [0, n_i):
        out[o with the reduced axes := 0, v_i := a_i[o]] += x'[o with v_i := a_i[o]]

An index outside [0, n_i) adds nothing, which is what the one-hot sum gives it; the index is clamped before it
becomes an address, so nothing is ever written out of bounds (the store is also gated off). The scheduler gives a
SCATTER two kernels of its own (a zero fill, then the accumulating kernel, `KernelBuilder.build_scatter`), since it
writes to data-dependent places; its consumers read its buffer. GPUs add with atomics, the CPU without (see
codegen/__init__.py: the outer loop is split over threads only where no two threads can add to one element).

Only where the device's renderer can accumulate the dtype (`CStyleLanguage.scatter_dtypes`: CUDA's `atomicAdd`,
Metal's atomic float/int); elsewhere the one-hot sum stays (slow, never wrong). Symbolic shapes are left alone.
"""
from __future__ import annotations

from glassgrad.helpers import prod
from glassgrad.schedule.gather import _conjuncts, _is_zero, _selections, masked_by_the_rest, selected_indices
from glassgrad.uop.ops import Ops, UOp


def scatter_one_hot(u: UOp, uses: dict[UOp, int]) -> UOp | None:
    """REDUCE_AXIS(ADD, where(AND(index == arange_v, ...), x, 0)) with v kept -> SCATTER (see the module docstring),
    or None."""
    if u.op is not Ops.REDUCE_AXIS or u.arg[0] is not Ops.ADD or not _accumulates(u):
        return None
    where, casts = u.src[0], []
    while where.op is Ops.CAST:  # cast(where(c, x, 0)) is where(c, cast(x), 0): a float16 sum accumulates in float32
        casts.append(where.dtype)
        where = where.src[0]
    if where.op is not Ops.WHERE or not _is_zero(where.src[2]) or not all(isinstance(s, int) for s in where.shape):
        return None
    reduced: tuple[int, ...] = u.arg[1]
    shape = where.shape
    if prod(shape[a] for a in reduced) < 2:  # nothing to collapse: the one-hot is elementwise already
        return None
    terms = _conjuncts(where.src[0])
    if terms is None:
        return None
    kept = tuple(a for a in range(len(shape)) if a not in reduced)
    chosen = _selections(terms, kept, shape)
    if not chosen:
        return None
    value, zero = where.src[1], where.src[2]
    for dtype in reversed(casts):
        value, zero = UOp(Ops.CAST, dtype, (value,)), UOp(Ops.CAST, dtype, (zero,))
    value = masked_by_the_rest(value, zero, terms, chosen)
    selected, indices = selected_indices(chosen, shape)
    return UOp(Ops.SCATTER, value.dtype, (value, *indices), (selected, reduced))


def _accumulates(u: UOp) -> bool:
    """Whether u's device can add its dtype at a data-dependent place (atomically on GPUs)."""
    device = u.device
    if not isinstance(device, str):
        return False
    from glassgrad.kernels import renderer_class  # (kernels.py imports the scheduler)
    try:
        supported = renderer_class(device).scatter_dtypes
    except (KeyError, ValueError):
        return False
    return u.dtype in supported

"""Kernel optimisation: `Opt` actions that reshape a kernel's loops, a hand-written heuristic, and `BEAM` search.

In: a simplified kernel AST. Out: the AST with some loops split and retyped, and which loops the linearizer puts
inside the reductions (the upcast ranges). The kernel's *axes* are its RANGE nodes, each of one kind:

| kind     | what the loop is                                                                 |
|----------|----------------------------------------------------------------------------------|
| global   | an output loop: the outermost is split across CPU threads; GPU threads on GPUs   |
| local    | GPU work-group threads along an output loop (`LOCAL`)                            |
| reduce   | a reduction loop: an accumulator is carried across it                            |
| group    | GPU threads sharing a reduction, combined in shared memory (`GROUP`)             |
| unroll   | the inner part of a split reduction loop: a lane of the register tile with its   |
|          | own accumulator (independent chains, SIMD), the lanes combined after the loop    |
| upcast   | the inner part of a split output loop, placed *inside* the reduction loops: a    |
|          | register tile (one accumulator per iteration), the innermost one SIMD lanes      |

`OPTLEVEL` changes no loop: it is the C compiler's optimisation level for this kernel (CPU only; `amount` is the
level, 2 or 3, `axis` 0): `-O3` completely unrolls and peels the short loops of a convolution's window (1.2-1.5x
faster with gcc 12) where it slowed other kernels (docs/OPTIMIZER.md, "Per-kernel optimisation level"). The
heuristic picks it by kernel kind, BEAM searches it like any other action; the level is written into the kernel's
source (a first line the CPU compiler reads: `renderer/cstyle.py`, `opt_level_line`), so every cache keyed by the
source keys on it.

`PADTO` changes no kind: it grows a global axis to a multiple of its amount (an output axis of 1023 becomes 1024),
so that an `UPCAST` by that amount divides it. The iterations past the original size compute values nobody sees:
every load and store they would make is gated off (their loads read nothing and give 0, their stores are skipped).

An `Opt(op, axis, amount)` names an axis by its position in `Kernel.axes` (ordered by kind, as in the table, then
by loop order) and an amount (0: the whole axis). Every action is validated first: one that does not fit the
kernel raises `KernelOptError`, it never changes what the kernel computes.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class OptOps(Enum):
    UPCAST = "upcast"   # split an output axis; its inner part becomes a register tile inside the reductions
    UNROLL = "unroll"   # split a reduce axis; its inner part becomes accumulator lanes, combined at the end
    LOCAL = "local"     # GPU only: split an output axis; its inner part becomes threads of a work-group
    GROUP = "group"     # GPU only: split a reduce axis; its inner part becomes threads that combine their shares
    SWAP = "swap"       # exchange the loop order of two output axes (`amount` is the other axis)
    PADTO = "padto"     # CPU only: grow an output axis to a multiple of `amount`; the extra iterations are gated off
    OPTLEVEL = "optlevel"  # CPU only: build the kernel with the C compiler's `-O<amount>` (no axis: `axis` is 0)


@dataclass(frozen=True)
class Opt:
    op: OptOps
    axis: int
    amount: int = 0

    def __repr__(self) -> str:
        return f"Opt({self.op.name}, {self.axis}, {self.amount})"


class KernelOptError(ValueError):
    """An optimisation that does not apply to this kernel (wrong axis, amount, kind, or device)."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise KernelOptError(message)

"""Memory planning: intermediate buffers whose lifetimes do not overlap share memory.

In: the ordered steps (kernels) of a computation, each as the keys of the buffers it touches, and for every key
that may share memory its device and size in bytes. Out: a block number per shareable key, and each block's device
and size. A block is one allocation; the buffers planned into it use it one after another, never at once.

A buffer lives from the first step that touches it to the last. Walking the steps in order, a buffer that starts
at step i takes a free block of its device (the smallest one big enough; else the largest free one, grown to fit,
which costs less than a new block; else a new block), and blocks whose buffers ended at step i are free again
from step i+1 on. A block is never freed within the step that uses it, so a kernel's output never shares memory
with its own inputs. This is greedy interval colouring, size-aware.

Two users: the JIT (engine/jit.py) plans the intermediates of a captured step, and the scheduler plans those of
every schedule (`SchedulePlan`): the buffers it creates for kernels whose results no tensor and no REALIZED entry
holds afterwards. A planned buffer keeps its identity (reads, writes and versions name it) and uses its block's
memory (`Buffer.share`). `MEMPLAN=0` leaves every schedule's buffers unplanned.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from glassgrad.device import Buffer
from glassgrad.dtype import dtypes
from glassgrad.helpers import MEMPLAN

K = TypeVar("K", bound=Hashable)


@dataclass
class Block:
    """One allocation shared by buffers whose lifetimes do not overlap."""
    device: str
    nbytes: int


def lifetimes(steps: Sequence[Sequence[K]]) -> dict[K, tuple[int, int]]:
    """key -> (first step, last step) that touches it."""
    spans: dict[K, tuple[int, int]] = {}
    for i, keys in enumerate(steps):
        for key in keys:
            first = spans[key][0] if key in spans else i
            spans[key] = (first, i)
    return spans


def plan_memory(steps: Sequence[Sequence[K]],
                shareable: Mapping[K, tuple[str, int]]) -> tuple[dict[K, int], list[Block]]:
    """Blocks for the `shareable` keys ({key: (device, nbytes)}). Returns ({key: block index}, blocks)."""
    spans = {k: v for k, v in lifetimes(steps).items() if k in shareable}
    starts: dict[int, list[K]] = {}
    ends: dict[int, list[K]] = {}
    for key, (first, last) in spans.items():
        starts.setdefault(first, []).append(key)
        ends.setdefault(last, []).append(key)
    blocks: list[Block] = []
    free: list[int] = []
    placed: dict[K, int] = {}
    for i in range(len(steps)):
        for key in starts.get(i, []):
            placed[key] = _take_block(blocks, free, *shareable[key])
        free.extend(placed[key] for key in ends.get(i, []))
    return placed, blocks


def _take_block(blocks: list[Block], free: list[int], device: str, nbytes: int) -> int:
    candidates = [b for b in free if blocks[b].device == device]
    fitting = [b for b in candidates if blocks[b].nbytes >= nbytes]
    if fitting:
        chosen = min(fitting, key=lambda b: blocks[b].nbytes)
    elif candidates:
        chosen = max(candidates, key=lambda b: blocks[b].nbytes)
        blocks[chosen].nbytes = nbytes
    else:
        blocks.append(Block(device, nbytes))
        return len(blocks) - 1
    free.remove(chosen)
    return chosen


def allocate_blocks(blocks: Iterable[Block]) -> list[Buffer]:
    """A buffer (of bytes) for each block of a plan."""
    return [Buffer(b.device, b.nbytes, dtypes.uint8) for b in blocks]


@dataclass(frozen=True)
class SchedulePlan:
    """Which buffers a schedule creates share memory: `block_of[k]` is the block of its k-th created buffer (None:
    memory of its own). It depends on the schedule's structure alone, so the schedule cache stores it with the
    schedule and places each instantiation's fresh buffers the same way."""
    block_of: tuple[int | None, ...]
    blocks: tuple[Block, ...]

    @staticmethod
    def make(steps: Sequence[Sequence[Buffer]], created: Sequence[Buffer], held: set[Buffer]) -> SchedulePlan:
        """The plan for a schedule whose items touch `steps` buffers in order; `created` are the buffers the
        scheduler made, `held` those that outlive the schedule (a tensor or REALIZED holds a view of them)."""
        shareable = {b: (b.device, max(b.nbytes, 1)) for b in created if b not in held}
        placed, blocks = plan_memory(steps, shareable)
        return SchedulePlan(tuple(placed.get(b) for b in created), tuple(blocks))

    def place(self, created: Sequence[Buffer]) -> None:
        """Put the created buffers (not allocated yet) into fresh blocks of this plan (unless MEMPLAN=0)."""
        if not MEMPLAN or not self.blocks:
            return
        pool = allocate_blocks(self.blocks)
        for buf, block in zip(created, self.block_of):
            if block is not None:
                buf.share(pool[block])

"""Memory planning: intermediate buffers whose lifetimes do not overlap share memory.

In: the ordered steps (kernels) of a computation, each as the keys of the buffers it touches, and for every key
that may share memory its device and size in bytes. Out: a block number per shareable key, and each block's device
and size. A block is one allocation; the buffers planned into it use it one after another, never at once.

A buffer lives from the first step that touches it to the last. The buffers are placed biggest first (ties: the
earlier start first), each into the smallest block of its device that is big enough and none of whose buffers
lives at the same time; else into a new block of its size. Blocks never grow: a block is as big as its first
buffer. Lifetimes that only touch (one ends at step i, the other starts there) overlap, so a kernel's output never
shares memory with its own inputs. This is greedy interval colouring by size ("greedy by size" offset-free
planning): the big buffers, which set the peak, get blocks first, and the small ones fill the gaps between them.

Two users: the JIT (engine/jit.py) plans the intermediates of a captured step, and the scheduler plans those of
every schedule (`SchedulePlan`): the buffers it creates for kernels whose results no tensor and no REALIZED entry
holds afterwards. A planned buffer keeps its identity (reads, writes and versions name it) and uses its block's
memory (`Buffer.share`). `MEMPLAN=0` leaves every schedule's buffers unplanned.
"""
from __future__ import annotations

import bisect
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
    blocks: list[Block] = []
    users: list[_Lifetimes] = []  # the lifetimes placed in each block
    by_size: dict[str, list[tuple[int, int]]] = {}  # device -> (nbytes, block), smallest first
    placed: dict[K, int] = {}
    for key in sorted(spans, key=lambda k: (-shareable[k][1], spans[k][0])):
        device, nbytes = shareable[key]
        first, last = spans[key]
        candidates = by_size.setdefault(device, [])
        start = bisect.bisect_left(candidates, (nbytes, -1))  # the smallest big enough, the earliest of a size first
        chosen = next((b for _, b in candidates[start:] if not users[b].overlaps(first, last)), None)
        if chosen is None:
            chosen = len(blocks)
            blocks.append(Block(device, nbytes))
            users.append(_Lifetimes())
            bisect.insort(candidates, (nbytes, chosen))
        placed[key] = chosen
        users[chosen].add(first, last)
    return placed, blocks


class _Lifetimes:
    """The lifetimes placed in one block: disjoint intervals of steps, kept sorted, so whether a new one overlaps
    any is one bisection (a scan of all of them made planning quadratic: an LSTM's backward unrolled over 40 steps,
    1,400 buffers per schedule, spent 20 s here)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []  # (disjoint and sorted by start, so sorted by end too)

    def overlaps(self, first: int, last: int) -> bool:
        """Whether [first, last] shares a step with one of them (touching counts)."""
        i = bisect.bisect_right(self.starts, last) - 1  # the last one starting at or before `last`
        return i >= 0 and self.ends[i] >= first

    def add(self, first: int, last: int) -> None:
        i = bisect.bisect_right(self.starts, first)
        self.starts.insert(i, first)
        self.ends.insert(i, last)


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

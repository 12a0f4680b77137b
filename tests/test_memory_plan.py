"""Memory planning of eager schedules: the buffers a schedule creates for intermediates share memory by lifetime
(engine/memory.py `SchedulePlan`), with the same results as without planning (MEMPLAN=0), and never the buffer of
a result that a tensor holds."""
from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from test_schedule import PROPERTY, Recorder, assert_matches, random_program

from glassgrad import Context, Device, GlobalCounters, Tensor
from glassgrad.device import Buffer
from glassgrad.dtype import dtypes
from glassgrad.engine.memory import lifetimes, plan_memory
from glassgrad.schedule import SCHEDULE_CACHE, create_schedule

MIB = 1 << 20


def _chain(x: Tensor, length: int = 10) -> Tensor:
    for _ in range(length):
        x = (x * 2 + 1).contiguous()
    return x


def _peak_of_realizing(t: Tensor) -> int:
    allocator = Device[Device.DEFAULT].allocator  # the device the test tensors live on
    gc.collect()
    allocator.reset_peak()
    before = allocator.live_bytes
    t.realize()
    return allocator.peak_bytes - before


def test_a_chain_of_intermediates_needs_two_blocks() -> None:
    """Ten 1 MiB intermediates in a row: each is read by the next kernel only, so two blocks take turns."""
    peaks = {}
    for plan in (0, 1):
        with Context(MEMPLAN=plan):
            x = Tensor.full((MIB // 4,), float(plan)).realize()
            result = _chain(x).sum()
            peaks[plan] = _peak_of_realizing(result)
            assert result.item() == (plan * 1024 + 1023) * MIB // 4
    assert peaks[0] >= 10 * MIB
    assert peaks[1] <= 2 * MIB + 64


def test_outputs_and_earlier_results_are_never_shared() -> None:
    """Every output of a realize keeps its own memory (its tensor holds it), as does a result realized before."""
    base = Tensor(np.arange(1024, dtype=np.float32)).realize()
    first = (base * 3).contiguous()
    middle = _chain(first, 4)
    last = _chain(middle, 4)
    schedule, views = create_schedule([middle.uop, last.uop])
    held = {views[middle.uop].base.arg[0], views[last.uop].base.arg[0]}
    shared = {b for item in schedule for b in item.bufs if b.block is not None}
    assert shared and not shared & held and base.uop.base.arg[0] not in shared
    Tensor.realize_all(middle, last)
    expected_middle = np.arange(1024, dtype=np.float32) * 3
    for _ in range(4):
        expected_middle = expected_middle * 2 + 1
    expected_last = expected_middle
    for _ in range(4):
        expected_last = expected_last * 2 + 1
    np.testing.assert_array_equal(middle.numpy(), expected_middle)
    np.testing.assert_array_equal(last.numpy(), expected_last)
    np.testing.assert_array_equal(base.numpy(), np.arange(1024))
    _chain(base, 6).realize()  # another planned schedule afterwards leaves them alone
    np.testing.assert_array_equal(middle.numpy(), expected_middle)
    np.testing.assert_array_equal(last.numpy(), expected_last)


def test_a_kernel_never_writes_over_its_own_input() -> None:
    x = Tensor(np.arange(256, dtype=np.float32)).realize()
    schedule, _ = create_schedule([_chain(x, 6).sum().uop])
    for item in schedule:
        memory = [b.block or b for b in item.bufs]
        assert len({id(m) for m in memory}) == len(memory)


def test_the_schedule_cache_places_fresh_buffers_by_the_plan() -> None:
    """A graph of a structure seen before takes the cached schedule; its fresh intermediates share memory too."""
    results = []
    for value in (1.0, 2.0):
        x = Tensor.full((4096,), value).contiguous().realize()
        hits = SCHEDULE_CACHE.hits
        schedule, _ = create_schedule([_chain(x, 6).sum().uop])
        shared = [b for item in schedule for b in item.bufs if b.block is not None]
        assert shared and len({id(b.block) for b in shared}) <= 2
        if value == 2.0:
            assert SCHEDULE_CACHE.hits == hits + 1
        results.append(_chain(x, 6).sum().item())
    assert results == [(value * 64 + 63) * 4096 for value in (1.0, 2.0)]


def test_an_assign_through_a_temporary_with_planning() -> None:
    q = Tensor(np.arange(16, dtype=np.float32).reshape(4, 4)).realize()
    q.assign((q.T + 1).contiguous() * 2).realize()
    np.testing.assert_array_equal(q.numpy(), (np.arange(16, dtype=np.float32).reshape(4, 4).T + 1) * 2)


def test_a_buffer_cannot_share_a_block_too_small_or_after_allocating() -> None:
    block = Buffer("CPU", 16, dtypes.uint8)
    with pytest.raises(ValueError, match="cannot live in"):
        Buffer("CPU", 64, dtypes.float32).share(block)
    allocated = Buffer("CPU", 4, dtypes.float32).copyin(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="cannot live in"):
        allocated.share(block)


@PROPERTY
@given(st.data(), st.sampled_from([np.int32, np.float32]), st.booleans())
def test_random_graphs_planned_equal_unplanned(data: st.DataObject, np_dtype: type, scache: bool) -> None:
    """A random program with planning and the same program (same values, other buffers) without: equal results,
    both equal to numpy."""
    recorder = Recorder(data.draw)
    with Context(SCACHE=int(scache)):
        GlobalCounters.reset()
        planned = random_program(recorder, np_dtype)
        Tensor.realize_all(*(n.t for n in planned))
        event(f"{GlobalCounters.kernel_count} kernels")
        with Context(MEMPLAN=0):
            unplanned = random_program(recorder.replay(0), np_dtype)
            Tensor.realize_all(*(n.t for n in unplanned))
    for a, b in zip(planned, unplanned):
        np.testing.assert_array_equal(a.t.numpy(), b.t.numpy())
        assert_matches(a)


def _plan_by_scanning(steps: list[list[int]], shareable: dict[int, tuple[str, int]]) -> dict[int, int]:
    """The planner's rule written as a scan of every block and every lifetime in it (what it was before it kept
    each block's lifetimes sorted, which made it quadratic in the buffers of a long unrolled backward)."""
    spans = {k: v for k, v in lifetimes(steps).items() if k in shareable}
    blocks: list[tuple[str, int]] = []
    users: list[list[tuple[int, int]]] = []
    placed: dict[int, int] = {}
    for key in sorted(spans, key=lambda k: (-shareable[k][1], spans[k][0])):
        device, nbytes = shareable[key]
        first, last = spans[key]
        free = [b for b, (dev, size) in enumerate(blocks) if dev == device and size >= nbytes and
                all(last < start or end < first for start, end in users[b])]
        placed[key] = min(free, key=lambda b: blocks[b][1]) if free else len(blocks)
        if not free:
            blocks.append((device, nbytes))
            users.append([])
        users[placed[key]].append((first, last))
    return placed


@given(st.data())
def test_plan_memory_places_as_the_scan_of_every_block(data: st.DataObject) -> None:
    n_keys = data.draw(st.integers(1, 40))
    steps = data.draw(st.lists(st.lists(st.integers(0, n_keys - 1), max_size=4), min_size=1, max_size=30))
    sizes = data.draw(st.lists(st.sampled_from([4, 8, 16, 64]), min_size=n_keys, max_size=n_keys))
    cuda = data.draw(st.sets(st.integers(0, n_keys - 1)))
    shareable = {k: ("CUDA" if k in cuda else "CPU", sizes[k]) for k in range(n_keys)}
    placed, _ = plan_memory(steps, shareable)
    assert placed == _plan_by_scanning(steps, shareable)

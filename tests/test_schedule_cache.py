"""The schedule cache: a graph with the structure of one scheduled before reuses its schedule, bound to its own
buffers. Checked here: that it hits when it should (same structure, other buffers; in-place writes at later
versions) and misses when it must (aliased inputs, other constants, -0.0 against 0.0), that a hit gives the
schedule the scheduler would have made, and that values stay right through assigns, cycles of assigns, reads of
realized nodes and stale reads. Random graphs are in tests/test_schedule.py (`test_random_graphs_reuse_...`).
"""
from __future__ import annotations

import gc
from collections.abc import Callable

import numpy as np
import pytest

from glassgrad import Context, Tensor, no_grad
from glassgrad.device import Buffer
from glassgrad.schedule import SCHEDULE_CACHE, ScheduleItem, create_schedule
from glassgrad.uop.ops import Ops, UOp


def hits_while(fn: Callable[[], object]) -> int:
    """How many schedule-cache hits calling fn() made."""
    before = SCHEDULE_CACHE.hits
    fn()
    return SCHEDULE_CACHE.hits - before


def data(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-4, 5, size=shape).astype(np.float32)


def graph(a: Tensor, b: Tensor) -> Tensor:
    """A few kernels: a reduction that is read through an expand (softmax-like), then an elementwise epilogue."""
    m = (a * b).max(axis=1, keepdim=True)
    return ((a - m) * 2 + b).sum(axis=0)


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    m = (a * b).max(axis=1, keepdims=True)
    return ((a - m) * 2 + b).sum(axis=0)


def test_same_structure_on_other_buffers_hits_and_is_right() -> None:
    a1, b1, a2, b2 = (data(4, 6, seed=s) for s in range(4))
    np.testing.assert_array_equal(graph(Tensor(a1), Tensor(b1)).numpy(), reference(a1, b1))
    out = graph(Tensor(a2), Tensor(b2))
    assert hits_while(out.realize) == 1
    np.testing.assert_array_equal(out.numpy(), reference(a2, b2))


def test_a_hit_is_the_schedule_the_scheduler_makes() -> None:
    """Same kernels, in the same order; the inputs are this graph's buffers; buffers the schedule creates are new
    and correspond one to one (and so do the versions read and written)."""
    graph(Tensor(data(4, 6, seed=0)), Tensor(data(4, 6, seed=1))).realize()
    a, b = Tensor(data(4, 6, seed=2)), Tensor(data(4, 6, seed=3))
    out = graph(a, b)
    with Context(SCACHE=0):
        plain, plain_views = create_schedule([out.uop])
    hits = SCHEDULE_CACHE.hits
    cached, cached_views = create_schedule([out.uop])
    assert SCHEDULE_CACHE.hits == hits + 1
    inputs = {id(a.uop.base.arg[0]), id(b.uop.base.arg[0])}
    assert_same_schedule(plain, cached, inputs)
    assert list(plain_views) == list(cached_views)


def assert_same_schedule(plain: list[ScheduleItem], cached: list[ScheduleItem], inputs: set[int]) -> None:
    assert [i.ast for i in plain] == [i.ast for i in cached]
    mapping: dict[int, Buffer] = {}

    def same(x: Buffer, y: Buffer) -> None:
        if id(x) in inputs:
            assert x is y
        else:
            assert id(y) not in inputs and mapping.setdefault(id(x), y) is y

    for p, c in zip(plain, cached):
        assert len(p.bufs) == len(c.bufs)
        for x, y in zip(p.bufs, c.bufs):
            same(x, y)
        assert {(mapping.get(id(b), b), v) for b, v in p.reads} == set(c.reads)
        assert len(p.writes) == len(c.writes)
        for (p_buf, p_version), (c_buf, c_version) in zip(p.writes, c.writes):
            same(p_buf, c_buf)
            assert p_version == c_version
    assert len(set(map(id, mapping.values()))) == len(mapping)  # one new buffer for each


def test_aliased_inputs_are_another_structure() -> None:
    """f(a, b) then f(c, c): one buffer in two places changes the graph (and in-place hazards), so no hit."""
    a1, b1, c = data(4, 6, seed=10), data(4, 6, seed=11), data(4, 6, seed=12)
    graph(Tensor(a1), Tensor(b1)).realize()
    t = Tensor(c)
    out = graph(t, t)
    assert hits_while(out.realize) == 0
    np.testing.assert_array_equal(out.numpy(), reference(c, c))


@pytest.mark.parametrize("first, second, lift", [(2.0, 3.0, 0), (0.0, -0.0, 1), (-0.0, 0.0, 1)])
def test_other_constants_are_another_structure(first: float, second: float, lift: int) -> None:
    """Constants kernels keep as literals (all, with LIFT_CONSTANTS=0; 0 and -0 always) are part of the structure."""
    SCHEDULE_CACHE.clear()
    x = data(8, seed=20)
    with Context(LIFT_CONSTANTS=lift):
        (Tensor(x) / first if first else Tensor(x) * first).realize()
        out = Tensor(x) / second if second else Tensor(x) * second
        assert hits_while(out.realize) == 0
    np.testing.assert_array_equal(out.numpy(), x / second if second else x * second)
    assert np.array_equal(np.signbit(out.numpy()), np.signbit(x / second if second else x * second))


def test_scache_0_schedules_every_time() -> None:
    with Context(SCACHE=0):
        graph(Tensor(data(3, 5, seed=0)), Tensor(data(3, 5, seed=1))).realize()
        assert hits_while(graph(Tensor(data(3, 5, seed=2)), Tensor(data(3, 5, seed=3))).realize) == 0


def test_outputs_that_are_reshapes_get_views_of_their_own_shape() -> None:
    for seed in range(3):
        a, b = data(4, 6, seed=seed), data(4, 6, seed=seed + 10)
        s = Tensor(a) + Tensor(b)
        flat, square = s.reshape(24), (Tensor(a) * 2).reshape(2, 2, 6)
        Tensor.realize_all(flat, square, s)
        assert flat.shape == (24,) and square.shape == (2, 2, 6) and s.shape == (4, 6)
        np.testing.assert_array_equal(flat.numpy(), (a + b).reshape(24))
        np.testing.assert_array_equal(square.numpy(), (a * 2).reshape(2, 2, 6))
        np.testing.assert_array_equal(s.numpy(), a + b)


def test_reads_of_realized_nodes() -> None:
    """A node realized earlier is a leaf of the next graph (loaded from its buffer): its buffer fills a slot."""
    for seed in range(3):
        x = Tensor(data(5, 4, seed=seed))
        total = x.sum()
        total.realize()
        out = x - total  # `total`'s node is in REALIZED now: loaded, not recomputed
        hits = hits_while(out.realize)
        assert seed == 0 or hits == 1
        np.testing.assert_array_equal(out.numpy(), data(5, 4, seed=seed) - data(5, 4, seed=seed).sum())


def test_assign_loop_hits_from_the_second_step() -> None:
    """w -= 0.5 * (x * w): the same buffer, a new version every step; every step after the first is a hit."""
    w_ref, x_ref = data(16, seed=1), data(16, seed=2)
    w, x = Tensor(w_ref.copy()), Tensor(x_ref)
    hits = []
    for _ in range(4):
        hits.append(hits_while(w.assign(w - (x * w) * 0.5).realize))
        w_ref = w_ref - (x_ref * w_ref) * np.float32(0.5)
        np.testing.assert_array_equal(w.numpy(), w_ref)
    assert hits[1:] == [1, 1, 1]
    assert w.uop.base.arg[0].version == 4


def test_assigns_that_wait_on_each_other() -> None:
    """a, b = b + 1, a * 2 in place: each value reads the other's old buffer, so one goes through a temporary;
    the cached schedule keeps that temporary (a new buffer every time) and the order."""
    a_ref, b_ref = data(8, seed=3), data(8, seed=4)
    a, b = Tensor(a_ref.copy()), Tensor(b_ref.copy())
    for step in range(3):
        new_a, new_b = b + 1, a * 2
        a.assign(new_a)
        b.assign(new_b)
        hits = hits_while(lambda: Tensor.realize_all(a, b))
        assert step == 0 or hits == 1
        a_ref, b_ref = b_ref + 1, a_ref * 2
        np.testing.assert_array_equal(a.numpy(), a_ref)
        np.testing.assert_array_equal(b.numpy(), b_ref)


def test_assign_of_a_transpose_goes_through_a_temporary_every_time() -> None:
    x_ref = data(4, 4, seed=5)
    x = Tensor(x_ref.copy())
    for step in range(3):
        hits = hits_while(x.assign(x.T + 1).realize)
        assert step == 0 or hits == 1
        x_ref = x_ref.T + 1
        np.testing.assert_array_equal(x.numpy(), x_ref)


def test_old_values_are_kept_when_the_structure_is_cached() -> None:
    """A lazy graph on a buffer that an assign then overwrites keeps its value, cached structure or not."""
    other = Tensor(data(8, seed=6))
    (other * 2).realize()  # the structure of `before` below is in the cache now
    x = Tensor(data(8, seed=7))
    expected = x.numpy() * 2
    before = x * 2
    x.assign(x + 1).realize()
    np.testing.assert_array_equal(before.numpy(), expected)


def test_training_loop_matches_a_loop_without_the_cache() -> None:
    """Two copies of a small model trained the same way, one with SCACHE=0: the same parameters bit for bit."""
    from glassgrad.nn import Linear, optim

    def train(cache: int) -> list[np.ndarray]:
        Tensor.manual_seed(0)
        layers = [Linear(6, 8), Linear(8, 3)]
        params = [p for layer in layers for p in (layer.weight, layer.bias) if p is not None]
        opt = optim.Adam(params, lr=0.01)
        rng = np.random.default_rng(0)
        with Context(SCACHE=cache), Tensor.train():
            for _ in range(4):
                x = Tensor(rng.standard_normal((5, 6), dtype=np.float32))
                y = Tensor(rng.integers(0, 3, 5).astype(np.int32))
                opt.zero_grad()
                loss = layers[1](layers[0](x).relu()).sparse_categorical_crossentropy(y).backward()
                with no_grad():
                    Tensor.realize_all(loss, *opt.schedule_step())
        return [p.numpy() for p in params]

    hits = SCHEDULE_CACHE.hits
    cached = train(1)
    assert SCHEDULE_CACHE.hits - hits >= 3  # every step after the first
    for got, want in zip(cached, train(0)):
        np.testing.assert_array_equal(got, want)


def test_cache_keys_hold_no_buffers() -> None:
    """A key describes structure only: caching a graph must not keep its buffers (or their memory) alive."""
    import gc
    import weakref
    x = Tensor(data(32, seed=8))
    buf = weakref.ref(x.uop.base.arg[0])
    (x * 3 + 1).realize()
    del x
    gc.collect()
    assert buf() is None


def test_the_cache_is_bounded() -> None:
    from glassgrad.engine.memory import SchedulePlan
    from glassgrad.schedule.cache import ScheduleCache, ScheduleTemplate
    cache = ScheduleCache(capacity=2)
    empty = ScheduleTemplate((), (), (), SchedulePlan((), ()))
    for key in range(4):
        cache.put((key,), empty)
    assert len(cache) == 2 and cache.get((0,)) is None and cache.get((3,)) is empty


def test_the_cache_evicts_the_least_recently_used() -> None:
    """A hit makes its entry the most recently used: the next eviction takes the entry unused the longest."""
    from glassgrad.engine.memory import SchedulePlan
    from glassgrad.schedule.cache import ScheduleCache, ScheduleTemplate
    cache = ScheduleCache(capacity=3)
    templates = [ScheduleTemplate((), (), (), SchedulePlan((), ())) for _ in range(5)]
    for key in range(3):
        cache.put((key,), templates[key])
    assert cache.get((0,)) is templates[0]  # 1 is now the oldest
    cache.put((3,), templates[3])
    assert cache.get((1,)) is None and cache.get((0,)) is templates[0]  # 2 is now the oldest
    cache.put((4,), templates[4])
    assert cache.get((2,)) is None
    assert [cache.get((k,)) for k in (0, 3, 4)] == [templates[0], templates[3], templates[4]]


def test_views_are_rebuilt_as_buffer_reshapes() -> None:
    x = Tensor(data(2, 3, seed=9))
    out = (x + 1).permute(1, 0)
    out.realize()
    base: UOp = out.uop.base
    assert base.arg[0].size == 6 and out.shape == (3, 2)


def test_symbolic_sizes_hit_only_for_the_same_values() -> None:
    """A bound Variable carries its value in the graph, so the same value on other buffers hits (and its kernels
    get that value), another value is another structure; views of symbolic shapes are never cached."""
    from glassgrad import Variable
    i = Variable("rows", 1, 8)
    results = []
    for value, seed in [(3, 1), (3, 2), (5, 3)]:
        x_ref = data(8, 6, seed=seed)
        out = Tensor(x_ref)[:i.bind(value)].sum(axis=0)  # shape (6,): an int shape over a symbolic reduction
        results.append(hits_while(out.realize))
        np.testing.assert_array_equal(out.numpy(), x_ref[:value].sum(axis=0))
        part = Tensor(x_ref)[:i.bind(value)] * 2  # a symbolic shape: its view shrinks its buffer
        part.realize()
        np.testing.assert_array_equal(part.numpy(), x_ref[:value] * 2)
    assert results[1] == 1 and results[2] == 0


def test_realized_entries_leave_with_their_nodes_and_never_answer_for_a_new_node() -> None:
    """REALIZED keys its entries by id(node); each entry's weak reference drops it when the node dies, so the table
    does not grow with a loop that realizes fresh graphs, and a node made later (whatever its id) is not realized."""
    from glassgrad.schedule import REALIZED
    x = Tensor(np.arange(16, dtype=np.float32)).realize()
    gc.collect()
    before = len(REALIZED.id_tables()[0])
    for i in range(50):
        y = (x * float(i + 2)).realize()
        np.testing.assert_array_equal(y.numpy(), np.arange(16) * (i + 2))
        del y
    gc.collect()
    assert len(REALIZED.id_tables()[0]) <= before + 2
    lazy = x * 1.5 + 0.25
    assert REALIZED.get(lazy.uop) is None
    np.testing.assert_array_equal(lazy.numpy(), np.arange(16) * 1.5 + 0.25)


def test_a_cache_hit_reads_the_values_the_buffers_hold_now() -> None:
    """A schedule-cache hit binds this call's buffers: after an assign changes an input, the same structure gives the
    new values (not those of the call the template was made for), and an earlier result keeps its own."""
    a = Tensor(np.arange(8, dtype=np.float32)).realize()
    b = Tensor(np.ones(8, np.float32)).realize()
    first = (a * b + 1.0).realize()
    b.assign(b * 3).realize()
    second = (a * b + 1.0).realize()  # a hit: same structure, b at its new version
    np.testing.assert_array_equal(first.numpy(), np.arange(8) + 1)
    np.testing.assert_array_equal(second.numpy(), np.arange(8) * 3 + 1)


# ---------------------------------------------------------------- replays (engine/realize.py: `replay`)
@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each realize's cache hit that `schedule_and_run` replayed: True when the replay ran, False when it gave back
    to `run_schedule` (a kernel not compiled). The schedule cache starts empty: a test's first graph is a miss."""
    from glassgrad.engine import realize
    SCHEDULE_CACHE.clear()
    seen: list[bool] = []
    original = realize.replay

    def spy(hit: object) -> dict[UOp, UOp] | None:
        views = original(hit)  # type: ignore[arg-type]
        seen.append(views is not None)
        return views
    monkeypatch.setattr(realize, "replay", spy)
    return seen


def test_a_replay_runs_on_this_graphs_buffers(replays: list[bool]) -> None:
    """The same structure on new inputs (and new outputs) every time: each replay reads its own inputs and writes
    a new output buffer, so no earlier result changes."""
    outs, refs = [], []
    for seed in range(4):
        a, b = data(4, 6, seed=seed), data(4, 6, seed=seed + 20)
        outs.append(graph(Tensor(a), Tensor(b)).realize())
        refs.append(reference(a, b))
    assert replays == [True, True, True]
    assert len({id(o.uop.base.arg[0]) for o in outs}) == 4
    for out, ref in zip(outs, refs):
        np.testing.assert_array_equal(out.numpy(), ref)


def test_a_replay_reads_an_input_after_an_assign(replays: list[bool]) -> None:
    """x * 2 + 1 before and after x is overwritten in place: the replay reads x's current version."""
    x_ref = data(8, seed=30)
    x = Tensor(x_ref.copy())
    first = (x * 2 + 1).realize()
    x.assign(x * 3).realize()
    second = (x * 2 + 1).realize()
    assert replays and replays[-1]
    np.testing.assert_array_equal(first.numpy(), x_ref * 2 + 1)
    np.testing.assert_array_equal(second.numpy(), x_ref * 3 * 2 + 1)


def test_a_replayed_assign_records_its_write(replays: list[bool]) -> None:
    """An assign replayed: the buffer's version moves on (a tensor that read the old version keeps its value), the
    target tensor holds the new version, and the graph read before the write is realized with it."""
    w_ref, x_ref = data(16, seed=31), data(16, seed=32)
    w, x = Tensor(w_ref.copy()), Tensor(x_ref)
    for step in range(4):
        before = w * 2  # reads the version the step overwrites: realized with the step, before the write
        w.assign(w - x * 0.5).realize()
        assert w.uop.op is not Ops.ASSIGN and w.uop.base.arg[1] == step + 1 == w.uop.base.arg[0].version
        np.testing.assert_array_equal(before.numpy(), w_ref * 2)
        w_ref = w_ref - x_ref * np.float32(0.5)
        np.testing.assert_array_equal(w.numpy(), w_ref)
    assert replays.count(True) >= 3


def test_replays_with_other_variable_values(replays: list[bool]) -> None:
    """A bound Variable's value is part of the structure: each value's kernels get that value when replayed, not
    the value of the schedule replayed before."""
    from glassgrad import Variable
    x_ref = data(8, 4, seed=33)
    x = Tensor(x_ref)
    v = Variable("rows", 1, 8)
    for rows in (3, 5, 3, 5, 2, 3):
        out = (x[:v.bind(rows)] * 2).sum(axis=0)  # (a concrete shape: a symbolic shape's view is never cached)
        np.testing.assert_array_equal(out.numpy(), (x_ref[:rows] * 2).sum(axis=0))
    assert replays.count(True) >= 3


def test_a_replay_hands_back_view_outputs(replays: list[bool]) -> None:
    """Outputs that are reshapes of one buffer (and that buffer's own output) come back as views of one new buffer
    per call, each of its own shape."""
    for seed in range(3):
        a = data(4, 6, seed=seed + 40)
        s = Tensor(a) + 1
        flat, cube = s.reshape(24), s.reshape(2, 2, 6)
        Tensor.realize_all(flat, cube, s)
        assert flat.uop.base.arg[0] is cube.uop.base.arg[0] is s.uop.base.arg[0]
        np.testing.assert_array_equal(flat.numpy(), (a + 1).reshape(24))
        np.testing.assert_array_equal(cube.numpy(), (a + 1).reshape(2, 2, 6))
        np.testing.assert_array_equal(s.numpy(), a + 1)
    assert replays == [True, True]


def _graphs_of_views() -> list[Callable[[Tensor], list[Tensor]]]:
    """Graphs whose outputs are views: a reduction reshaped (its keepdim node's view shares the output's buffer),
    several reshapes of one buffer, two kernels."""
    return [lambda x: [x.sum(axis=1)], lambda x: [x.sum(axis=0, keepdim=True), x.max(axis=1)],
            lambda x: [(s := x * 2 + 1).reshape(24), s.reshape(2, 2, 6), s, s.sum(axis=1)],
            lambda x: [graph(x, x + 1)]]


@pytest.mark.parametrize("case", range(4))
def test_a_replays_views_are_the_templates_chains(case: int) -> None:
    """`views_for` starts a view's chain of nodes from an earlier view's where one is its prefix (the same buffer
    and version): every view is still the node its own chain builds (hash-consing: the same node), and the outputs
    hold the right values."""
    from glassgrad.schedule import find_schedule
    from glassgrad.schedule.cache import ScheduleTemplate
    make = _graphs_of_views()[case]
    x_ref = data(4, 6, seed=50 + case)
    x = Tensor(x_ref)
    for _ in range(2):
        Tensor.realize_all(*make(x))
    outs = make(x)
    found = find_schedule([t.uop for t in outs])
    assert not isinstance(found, tuple)
    template: ScheduleTemplate = found.template
    bufs, base_version = template.bind(found.key)
    views = template.views_for(bufs, base_version, found.nodes, found.outs)
    for is_out, index, (ref, offset, shapes) in template.views:  # each chain built on its own
        buf = bufs[ref]
        view = UOp(Ops.BUFFER, buf.dtype, (), (buf, base_version[ref] + offset))
        for shape in shapes:
            view = UOp(Ops.RESHAPE, buf.dtype, (view,), shape)
        assert views[found.outs[index] if is_out else found.nodes[index]] is view
    Tensor.realize_all(*outs)
    with Context(SCACHE=0):
        want = [t.numpy() for t in make(Tensor(x_ref))]
    for out, ref in zip(outs, want):
        np.testing.assert_array_equal(out.numpy(), ref)


@pytest.mark.parametrize("case", range(4))
def test_a_replay_counts_what_run_schedule_counts(case: int, replays: list[bool]) -> None:
    """GlobalCounters after a replay (the template's bytes per item) are what running the scheduler's items
    counts: kernels, FLOPs and bytes."""
    from glassgrad import GlobalCounters
    make = _graphs_of_views()[case]
    x = Tensor(data(4, 6, seed=60 + case))
    counts = []
    for scache in (0, 1, 1, 1):
        with Context(SCACHE=scache):
            outs = make(x)
            GlobalCounters.reset()
            Tensor.realize_all(*outs)
            counts.append((GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem))
    assert replays and all(replays)
    assert counts[0] == counts[1] == counts[2] == counts[3] and counts[0][0] > 0


def test_a_replayed_result_keeps_its_lineage(replays: list[bool]) -> None:
    """A result realized by a replay is recorded (REALIZED, LINEAGE) as any other: a backward through it reaches
    the parameter it was computed from."""
    from glassgrad.schedule import REALIZED
    x_ref, w_ref = data(6, seed=50), data(6, seed=51)
    for _ in range(3):
        w = Tensor(w_ref.copy(), requires_grad=True)
        x = Tensor(x_ref)
        y = w * x + 1
        node = y.uop
        y.realize()
        assert REALIZED.get(node) is y.uop
        (y * y).sum().backward()
        assert w.grad is not None
        np.testing.assert_allclose(w.grad.numpy(), 2 * (w_ref * x_ref + 1) * x_ref, rtol=1e-6)
    assert replays and all(replays)


def test_a_replay_without_its_kernel_gives_back_to_run_schedule(monkeypatch: pytest.MonkeyPatch,
                                                                replays: list[bool]) -> None:
    """The kernel cache emptied (or other codegen flags): the hit is not replayed, nothing runs twice, and
    run_schedule compiles the kernel again."""
    from glassgrad import GlobalCounters
    from glassgrad.engine import realize
    a = data(4, 6, seed=60)
    graph(Tensor(a), Tensor(a + 1)).realize()
    replays.clear()
    monkeypatch.setattr(realize, "_kernel_cache", {})
    GlobalCounters.reset()
    out = graph(Tensor(a), Tensor(a + 1)).realize()
    kernels = GlobalCounters.kernel_count
    np.testing.assert_array_equal(out.numpy(), reference(a, a + 1))
    assert replays == [False]
    GlobalCounters.reset()
    graph(Tensor(a), Tensor(a + 1)).realize()
    assert replays == [False, True] and GlobalCounters.kernel_count == kernels


def test_items_are_made_while_something_watches_them(replays: list[bool]) -> None:
    """TIMING and DEBUG>=2 time or print each item (run_schedule does): a hit is instantiated then, not replayed."""
    a = data(4, 6, seed=70)
    graph(Tensor(a), Tensor(a)).realize()
    replays.clear()
    with Context(TIMING=1):
        out = graph(Tensor(a + 1), Tensor(a)).realize()
    np.testing.assert_array_equal(out.numpy(), reference(a + 1, a))
    assert replays == []


# ---------------------------------------------------------------- structure keys never collide
def _pairs() -> dict[str, tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor],
                                Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]]:
    """Graphs that differ in one detail only, each with numpy's reference: a constant (and its type), a dtype, a
    view's offset or strides, a reduction's axis."""
    from glassgrad import dtypes
    return {
        "constant": (lambda x: x * 2.0 + 1.0, lambda x: x * 2.0 + 1.5, lambda a: a * 2 + 1, lambda a: a * 2 + 1.5),
        "int constant": (lambda x: x.cast(dtypes.int32) + 1, lambda x: x.cast(dtypes.int32) + 2,
                         lambda a: a.astype(np.int32) + 1, lambda a: a.astype(np.int32) + 2),
        "dtype": (lambda x: (x * 3.3).cast(dtypes.int32), lambda x: (x * 3.3).cast(dtypes.int16),
                  lambda a: (a * np.float32(3.3)).astype(np.int32), lambda a: (a * np.float32(3.3)).astype(np.int16)),
        "half dtype": (lambda x: (x / 3).cast(dtypes.float16).cast(dtypes.float32),
                       lambda x: (x / 3).cast(dtypes.bfloat16).cast(dtypes.float32),
                       lambda a: (a / np.float32(3)).astype(np.float16).astype(np.float32), None),
        "offset": (lambda x: x[1:9] * 2, lambda x: x[2:10] * 2, lambda a: a[1:9] * 2, lambda a: a[2:10] * 2),
        "stride": (lambda x: x[0:12:2] + 1, lambda x: x[0:12:3][:4].pad(((0, 2),)) + 1,
                   lambda a: a[0:12:2] + 1, lambda a: np.pad(a[0:12:3][:4], (0, 2)) + 1),
        "permute": (lambda x: x.reshape(4, 4).permute(1, 0).contiguous() * 1.5, lambda x: x.reshape(4, 4) * 1.5,
                    lambda a: a.reshape(4, 4).T * 1.5, lambda a: a.reshape(4, 4) * 1.5),
        "flip": (lambda x: x.flip(0) - 1, lambda x: x - 1, lambda a: a[::-1] - 1, lambda a: a - 1),
        "axis": (lambda x: x.reshape(4, 4).sum(0), lambda x: x.reshape(4, 4).sum(1),
                 lambda a: a.reshape(4, 4).sum(0), lambda a: a.reshape(4, 4).sum(1)),
    }


@pytest.mark.parametrize("name", list(_pairs()))
def test_graphs_that_differ_in_one_detail_get_their_own_kernels(name: str) -> None:
    """Two graphs alike but for one detail, realized one after the other, each twice on new inputs (a hit on its
    own entry the second time): every result is its own graph's. A structure key that dropped the detail would hand
    the second graph the first one's kernels (a BEAM cache keyed on an abbreviated repr once did)."""
    first, second, ref_first, ref_second = _pairs()[name]
    SCHEDULE_CACHE.clear()
    for seed in range(2):
        for build, ref in ((first, ref_first), (second, ref_second)):
            a = np.random.default_rng(seed).integers(-8, 9, size=16).astype(np.float32)
            got = build(Tensor(a)).numpy()
            if ref is None:  # bfloat16's rounding has no numpy dtype: it must differ from float16's somewhere
                assert not np.array_equal(got, ref_first(a))
                continue
            np.testing.assert_array_equal(got, ref(a))
    assert SCHEDULE_CACHE.hits >= 2  # (the second seed's graphs are hits: the cache was in use)


def test_a_leaf_of_another_size_is_another_structure() -> None:
    """The same slice of a buffer of 16 and of one of 10 elements: one graph but for the leaf's size (the key
    tells them apart; the kernel, reading the first 8 elements, would be right for both)."""
    SCHEDULE_CACHE.clear()
    for n in (16, 10, 16, 10):
        a = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal((Tensor(a)[:8] * 2).numpy(), a[:8] * 2)


def test_leaves_on_other_devices_are_another_structure() -> None:
    """The same graph on CPU and on CPU:1 buffers: each result on its own device, with its own values."""
    SCHEDULE_CACHE.clear()
    for device in ("CPU", "CPU:1", "CPU", "CPU:1"):
        a = np.arange(8, dtype=np.float32) + len(device)
        out = Tensor(a, device=device) + Tensor(a * 3, device=device)  # (no constant: its DEVICE node names one)
        out.realize()
        assert out.device == device and out.uop.base.arg[0].device == device
        np.testing.assert_array_equal(out.numpy(), a * 4)


@pytest.mark.parametrize("dtype", ["int16", "uint8", "float16"])
def test_leaves_of_other_dtypes_are_another_structure(dtype: str) -> None:
    """`x.cast(float32) + y` on int32 leaves, then on leaves of another dtype: the graph above the leaves is the
    same, so only the leaves tell the two apart (the kernel loads another type)."""
    from glassgrad import dtypes
    SCHEDULE_CACHE.clear()
    for name in ("int32", dtype, "int32", dtype):
        a = (np.arange(8) * 37 % 200).astype(name)
        out = Tensor(a).cast(dtypes.float32) + Tensor(np.ones(8, np.float32))
        np.testing.assert_array_equal(out.numpy(), a.astype(np.float32) + 1)


def test_variables_with_other_bounds_or_values_are_other_structures() -> None:
    """A bound Variable in a graph: another value, or the same value of a Variable with another range, is another
    structure (each value is its own kernel argument; the range decides the buffer sizes and the code)."""
    from glassgrad import Variable
    SCHEDULE_CACHE.clear()
    a = np.arange(12, dtype=np.float32)
    for low, high, value in ((1, 8, 3), (1, 8, 5), (1, 10, 3), (2, 8, 3), (1, 8, 3)):
        i = Variable("n", low, high)
        out = (Tensor(a)[:i.bind(value)] * 2).sum()
        np.testing.assert_array_equal(out.numpy(), (a[:value] * 2).sum())

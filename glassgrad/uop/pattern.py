"""Rewrite rules: `UPat` patterns, a `PatternMatcher` of (pattern, function) rules, and `graph_rewrite`.

In: a UOp graph and a list of rules. Out: the graph rewritten bottom-up until no rule matches anywhere.
Every transformation in glassgrad (simplification, lowering, dtype fix-ups) is written as such rules.

    pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: x if c.arg == 0 else None)])
    graph_rewrite(expr, pm)   # x + 0 -> x everywhere

A rule's function gets the named captures as keyword arguments (and `ctx=`, the context given to `rewrite` or
`graph_rewrite`, when it has a parameter of that name); returning None means "no change". Rules are tried in the
order given, whether they name ops or match any op. Patterns on commutative binary ops match either source order.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from glassgrad.dtype import DType
from glassgrad.uop.ops import GroupOp, Ops, UOp


class UPat:
    """A pattern over UOps: op(s), dtype(s), sources, arg, and a name to capture the match under."""
    __slots__ = ("ops", "dtypes", "src", "arg", "name", "commutative")

    def __init__(self, op: Ops | tuple[Ops, ...] | frozenset[Ops] | None = None,
                 dtype: DType | tuple[DType, ...] | None = None, src: tuple[UPat, ...] | None = None,
                 arg: Any = None, name: str | None = None) -> None:
        self.ops = None if op is None else frozenset((op,) if isinstance(op, Ops) else op)
        self.dtypes = None if dtype is None else frozenset((dtype,) if isinstance(dtype, DType) else dtype)
        self.src = src
        self.arg = arg
        self.name = name
        self.commutative = self.ops is not None and src is not None and len(src) == 2 and \
            self.ops <= GroupOp.Commutative

    @staticmethod
    def var(name: str | None = None, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | tuple[DType, ...] | None = None) -> UPat:
        return UPat(Ops.CONST, dtype=dtype, name=name)

    def matches(self, u: UOp, captures: dict[str, UOp]) -> Iterator[dict[str, UOp]]:
        """Yield every way `u` matches this pattern, each as the captures dict extended."""
        if self.ops is not None and u.op not in self.ops:
            return
        if self.dtypes is not None and u.dtype not in self.dtypes:
            return
        if self.arg is not None and u.arg != self.arg:
            return
        if self.name is not None:
            if self.name in captures and captures[self.name] is not u:
                return
            captures = {**captures, self.name: u}
        if self.src is None:
            yield captures
            return
        if len(self.src) != len(u.src):
            return
        orders = [u.src, u.src[::-1]] if self.commutative and u.src[0] is not u.src[1] else [u.src]
        for srcs in orders:
            yield from _match_all(self.src, srcs, captures)


def _match_all(pats: tuple[UPat, ...], srcs: tuple[UOp, ...], captures: dict[str, UOp]) -> Iterator[dict[str, UOp]]:
    if not pats:
        yield captures
        return
    for c in pats[0].matches(srcs[0], captures):
        yield from _match_all(pats[1:], srcs[1:], c)


Rule = tuple[UPat, Callable[..., UOp | None]]


class PatternMatcher:
    """An ordered list of rules, indexed by the op each pattern starts with."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        # for each op, the rules that can match it, in the order they were given (rules for any op included)
        self._by_op: dict[Ops, list[tuple[UPat, Callable[..., UOp | None], bool]]] = {op: [] for op in Ops}
        for pat, fn in rules:
            entry = (pat, fn, "ctx" in inspect.signature(fn).parameters)
            for op in Ops if pat.ops is None else pat.ops:
                self._by_op[op].append(entry)

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        """Apply the first rule that matches `u` and returns something; None if none does."""
        for pat, fn, wants_ctx in self._by_op[u.op]:
            for captures in pat.matches(u, {}):
                result = fn(ctx=ctx, **captures) if wants_ctx else fn(**captures)
                if result is not None and result is not u:
                    return result
        return None


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx: Any = None, memo: dict[UOp, UOp] | None = None) -> UOp:
    """Rewrite the whole graph under `root` bottom-up, to a fixed point (sources first, then the node).

    A rule's result may contain new, unrewritten nodes, so it is rewritten in turn. The walk keeps its own stack
    (no recursion), so graphs and chains of rewrites of any depth work; rules that loop raise RuntimeError.
    `memo` (node -> its rewritten form) is read and extended: calls that pass the same dict share their work. Only
    for rules whose result depends on the node alone (no `ctx`, no state), always with the same `pm`."""
    return _walk(root, lambda u: pm.rewrite(u, ctx), {} if memo is None else memo)


def _walk(root: UOp, rewrite: Callable[[UOp], UOp | None], done: dict[UOp, UOp]) -> UOp:
    """`graph_rewrite`'s walk: `rewrite(node)` (its sources rewritten already) -> a replacement, or None (none; never
    the node itself). `done` maps each node walked to its result."""
    in_progress: set[UOp] = set()
    # (node, None): rewrite the node's sources first; (node, node): they are done, rewrite the node itself;
    # (node, replacement): a rule replaced the node and the replacement is done: take its result
    stack: list[tuple[UOp, UOp | None]] = [(root, None)]
    push, pop = stack.append, stack.pop
    while stack:
        node, step = pop()
        if step is None:
            if node in done:
                continue
            if node in in_progress:
                raise RuntimeError(f"rewrite rules loop: a rule's result depends on the node it replaces\n{node}")
            in_progress.add(node)
            push((node, node))
            for s in reversed(node.src):
                if s not in done:
                    push((s, None))
        elif step is node:
            src = node.src
            new_src = tuple([done[s] for s in src])
            current = node if new_src == src else node.replace(src=new_src)
            replacement = rewrite(current)
            if replacement is None:
                done[node] = current
                in_progress.discard(node)
            elif replacement in done:
                done[node] = done[replacement]
                in_progress.discard(node)
            else:
                push((node, replacement))
                push((replacement, None))
        else:
            done[node] = done[step]
            in_progress.discard(node)
    return done[root]


def substitute(root: UOp, mapping: dict[UOp, UOp], unchanged: dict[UOp, UOp] | None = None) -> UOp:
    """Replace nodes of `root`'s graph by their entries in `mapping`, bottom-up: a node is looked up once its sources
    are rewritten (so keys should be nodes whose sources no other key replaces), and a replacement is rewritten too.
    `unchanged`: `unchanged_by(..., keys)` for keys that include `mapping`'s (the walk does not enter those nodes:
    many substitutions into graphs that share a large part no key reaches skip that part)."""
    if not mapping:
        return root
    assert unchanged is None or not any(k in unchanged for k in mapping), "unchanged_by: for other keys"
    get = mapping.get

    def replaced(u: UOp) -> UOp | None:
        r = get(u)
        return None if r is u else r
    return _walk(root, replaced, {} if unchanged is None else dict(unchanged))


def unchanged_by(roots: Iterable[UOp], keys: Collection[UOp]) -> dict[UOp, UOp]:
    """{node: node} for every node under `roots` that is not one of `keys` and has none of them below it: what any
    `substitute` whose mapping's keys are among `keys` leaves as it is."""
    out: dict[UOp, UOp] = {}
    for u in UOp(Ops.SINK, src=tuple(roots)).toposort()[:-1]:
        if u not in keys and all(s in out for s in u.src):
            out[u] = u
    return out

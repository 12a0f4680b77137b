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
from collections.abc import Callable, Iterator
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


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx: Any = None) -> UOp:
    """Rewrite the whole graph under `root` bottom-up, to a fixed point (sources first, then the node).

    A rule's result may contain new, unrewritten nodes, so it is rewritten in turn. The walk keeps its own stack
    (no recursion), so graphs and chains of rewrites of any depth work; rules that loop raise RuntimeError."""
    done: dict[UOp, UOp] = {}
    in_progress: set[UOp] = set()
    # (node, None): rewrite the node's sources first; (node, node): they are done, rewrite the node itself;
    # (node, replacement): a rule replaced the node and the replacement is done: take its result
    stack: list[tuple[UOp, UOp | None]] = [(root, None)]
    while stack:
        node, step = stack.pop()
        if step is None:
            if node in done:
                continue
            if node in in_progress:
                raise RuntimeError(f"rewrite rules loop: a rule's result depends on the node it replaces\n{node}")
            in_progress.add(node)
            stack.append((node, node))
            stack.extend((s, None) for s in reversed(node.src) if s not in done)
        elif step is node:
            new_src = tuple(done[s] for s in node.src)
            current = node if new_src == node.src else node.replace(src=new_src)
            replacement = pm.rewrite(current, ctx)
            if replacement is None or replacement in done:
                _finish(node, current if replacement is None else done[replacement], done, in_progress)
            else:
                stack.append((node, replacement))
                stack.append((replacement, None))
        else:
            _finish(node, done[step], done, in_progress)
    return done[root]


def _finish(node: UOp, result: UOp, done: dict[UOp, UOp], in_progress: set[UOp]) -> None:
    done[node] = result
    in_progress.discard(node)


def substitute(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
    """Replace nodes of `root`'s graph by their entries in `mapping`, bottom-up: a node is looked up once its sources
    are rewritten (so keys should be nodes whose sources no other key replaces), and a replacement is rewritten too."""
    if not mapping:
        return root
    return graph_rewrite(root, PatternMatcher([(UPat(name="x"), lambda x: mapping.get(x))]))

"""Buffer versions: which lazy graphs read a buffer's contents that an in-place write is about to replace.

In: the tensor-graph nodes about to be realized, and the nodes of other lazy tensors still alive. Out: the set of
`(buffer, version)` the realize overwrites (`overwritten_versions`), and which of the other nodes read one of those
versions (`StaleReaders`), so the caller can compute them in the same schedule, before the write.

This is how a tensor keeps the value it had when it was built: `Tensor.assign` writes a buffer in place (its
identity matters to optimisers and the JIT), a tensor-graph `BUFFER` node names one version of that buffer, and a
graph that still needs an old version is realized together with the write (the scheduler orders every reader of
version v before the write that makes version v+1). Nothing is copied unless a tensor is a mere view of the old
version itself (then it is given a copy). See docs/ARCHITECTURE.md, "What a tensor means: assign and versions".
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

from glassgrad.schedule import BufferVersion, view_versions, without_reshapes
from glassgrad.uop.ops import Ops, UOp


def written_versions(assign: UOp) -> list[BufferVersion]:
    """The buffer versions an ASSIGN node writes over: its target's, or on several devices each part's."""
    target = assign.src[0]
    parts = target.src if target.op is Ops.MULTI else (target,)
    return [without_reshapes(p).arg for p in parts]


def overwritten_versions(outs: Iterable[UOp], realized: Callable[[UOp], UOp | None]) -> set[BufferVersion]:
    """The buffer versions that the ASSIGN nodes among `outs`' lazy graphs write over (`realized(node)` gives the
    view of a node computed before, where the walk stops)."""
    found: set[BufferVersion] = set()
    seen: set[UOp] = set()
    stack = list(outs)
    while stack:
        node = stack.pop()
        if node in seen or node.op is Ops.BUFFER or realized(node) is not None:
            continue
        seen.add(node)
        if node.op is Ops.ASSIGN:
            found.update(written_versions(node))
        stack.extend(node.src)
    return found


class StaleReaders:
    """Tells which lazy graphs read one of `overwritten`'s buffer versions (one memo for every graph asked about).

    The walk stops at nodes computed before (`realized`): such a node reads its buffer view, which is stale when
    that view's version is overwritten. It stops at the ASSIGN nodes being realized too (`writing`): a graph above
    one reads the new value, which the write gives it. An ASSIGN's target (its first source) is written, not read."""

    def __init__(self, overwritten: set[BufferVersion], realized: Callable[[UOp], UOp | None],
                 writing: set[UOp], owned_epoch: int | None = None,
                 realized_ids: tuple[dict[int, Any], dict[int, Any]] | None = None) -> None:
        """`owned_epoch`: `REALIZED.owned_epoch`, given when nothing is being written by this realize itself (a JIT
        replay's check): then what each graph reads is summarised once and reused while that epoch lasts.
        `realized_ids`: the tables `realized` looks nodes up in by id (`REALIZED.id_tables()`): it is asked only about
        nodes whose id is in one of them (nearly every node is in none: a dictionary test instead of a call)."""
        self.overwritten, self.realized, self.writing = overwritten, realized, writing
        self.owned_epoch = owned_epoch if not writing else None
        self.realized_ids = realized_ids
        self._memo: dict[UOp, bool] = {}

    def reads_old(self, root: UOp) -> bool:
        """Depth first, stopping at the first stale read: the nodes on the path to it read it too (memoised True);
        a node whose sources all answered False is memoised False; nodes left half-walked are simply not memoised.
        With an epoch: whether the graph's summary (`owned_reads`) holds an overwritten version."""
        if self.owned_epoch is not None:
            return not self.overwritten.isdisjoint(owned_reads(root, self.realized, self.owned_epoch))
        memo = self._memo
        if root in memo:
            return memo[root]
        leaf = self._leaf_answer(root)
        if leaf is not None:
            memo[root] = leaf
            return leaf
        path, pending = [root], [iter(_read_sources(root))]
        # (locals, and `_leaf_answer`'s and `_read_sources`' common cases inline: this loop runs over the graphs of a
        # training step's gradients at every step)
        writing, buffer_op, assign_op = self.writing, Ops.BUFFER, Ops.ASSIGN
        ids = self.realized_ids
        while path:
            node = next(pending[-1], None)
            if node is None:
                memo[path.pop()] = False
                pending.pop()
                continue
            answer = memo.get(node)
            if answer is None:
                if node in writing or node.op is buffer_op or ids is None or (i := id(node)) in ids[0] or i in ids[1]:
                    answer = self._leaf_answer(node)
                if answer is None:
                    path.append(node)
                    pending.append(iter(node.src[1:] if node.op is assign_op else node.src))
                    continue
                memo[node] = answer
            if answer:
                memo.update(dict.fromkeys(path, True))
                return True
        return False

    def _leaf_answer(self, node: UOp) -> bool | None:
        """The answer for a node the walk does not go below, or None to walk its sources."""
        if node in self.writing:
            return False
        if node.op is Ops.BUFFER:
            return node.arg in self.overwritten
        view = self.realized(node)
        if view is not None:
            return any(v in self.overwritten for v in view_versions(view))
        return None


# root node id -> (the node, the epoch it was made in, the versions it reads): `owned_reads`'s cache
_OWNED_READS: dict[int, tuple[weakref.ref[UOp], int, frozenset[BufferVersion]]] = {}


def owned_reads(root: UOp, realized: Callable[[UOp], UOp | None], epoch: int) -> frozenset[BufferVersion]:
    """The versions of buffers written in place (owned) that the lazy graph of `root` may read: its BUFFER leaves
    and the views its realized nodes are loaded from, walking on below realized nodes too. That is a superset of what
    any later realize of the graph reads while no owned view is recorded (`REALIZED.owned_epoch` unchanged): an
    entry that lapses (its view died) makes the node be recomputed from its sources, which are counted. So a reader
    may be realized when it need not be, never the reverse. Cached per root for the epoch: a JIT replay (generating
    token after token) asks about the same leftover lazy graphs each call."""
    entry = _OWNED_READS.get(id(root))
    if entry is not None and entry[0]() is root and entry[1] == epoch:
        return entry[2]
    found: set[BufferVersion] = set()
    seen: set[UOp] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op is Ops.BUFFER:
            if node.arg[0].owned:
                found.add(node.arg)
            continue
        view = realized(node)
        if view is not None:
            found.update(v for v in view_versions(view) if v[0].owned)
        stack.extend(_read_sources(node))
    key, versions = id(root), frozenset(found)

    def forget(ref: weakref.ref[UOp]) -> None:
        if (old := _OWNED_READS.get(key)) is not None and old[0] is ref:
            del _OWNED_READS[key]
    _OWNED_READS[key] = (weakref.ref(root, forget), epoch, versions)
    return versions


def _read_sources(node: UOp) -> tuple[UOp, ...]:
    """The sources a node reads: an ASSIGN's target (its first source) is written, not read."""
    return node.src[1:] if node.op is Ops.ASSIGN else node.src

"""Rewrite rules: UPat matching, PatternMatcher rule order and ctx, graph_rewrite to a fixed point, deep graphs."""
from __future__ import annotations

import pytest

from glassgrad.dtype import dtypes
from glassgrad.uop.ops import GroupOp, Ops, UOp
from glassgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite, substitute, unchanged_by

I32 = dtypes.int32


def c(value: int) -> UOp:
    return UOp.const(I32, value)


def rng(n: int, axis: int = 0) -> UOp:
    return UOp(Ops.RANGE, I32, (c(n),), (axis, "global"))


def match(pat: UPat, u: UOp) -> list[dict[str, UOp]]:
    return list(pat.matches(u, {}))


# ---------------------------------------------------------------- UPat
class TestUPat:
    def test_any_pattern_matches_everything_and_captures(self) -> None:
        u = rng(4) + 1
        assert match(UPat(), u) == [{}]
        assert match(UPat.var("x"), u) == [{"x": u}]

    def test_op_and_op_sets(self) -> None:
        u = rng(4) * 3
        assert match(UPat(Ops.MUL), u) == [{}]
        assert match(UPat(Ops.ADD), u) == []
        assert match(UPat((Ops.ADD, Ops.MUL)), u) == [{}]
        assert match(UPat(GroupOp.Binary), u) == [{}]
        assert match(UPat(GroupOp.Unary), u) == []

    def test_dtypes(self) -> None:
        f = UOp.const(dtypes.float32, 1.0)
        assert match(UPat.cvar("c", dtypes.float32), f) == [{"c": f}]
        assert match(UPat.cvar("c", dtypes.int32), f) == []
        assert match(UPat.cvar("c", (dtypes.int32, dtypes.float32)), f) == [{"c": f}]
        assert match(UPat(Ops.CMPLT, dtype=dtypes.bool), rng(4) < 2) == [{}]

    def test_arg(self) -> None:
        r0, r1 = rng(4, 0), rng(4, 1)
        assert match(UPat(Ops.RANGE, arg=(1, "global")), r1) == [{}]
        assert match(UPat(Ops.RANGE, arg=(1, "global")), r0) == []

    def test_src_patterns(self) -> None:
        r = rng(8)
        u = (r + 2) * 3
        pat = UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("a"))), UPat.cvar("b")))
        assert match(pat, u) == [{"x": r, "a": c(2), "b": c(3)}]
        assert match(UPat(Ops.MUL, src=(UPat.cvar("b"), UPat.var("x"), UPat.var("y"))), u) == []  # wrong arity
        assert match(UPat(Ops.MUL, src=(UPat(Ops.MUL), UPat.var())), u) == []

    def test_named_captures_must_agree(self) -> None:
        r, s = rng(8), rng(8, 1)
        same = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")))
        assert match(same, r + r) == [{"x": r}]
        assert match(same, r + s) == []
        nested = UPat(Ops.ADD, src=(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar())), UPat.var("x")))
        assert match(nested, r * 2 + r) == [{"x": r}]
        assert match(nested, r * 2 + s) == []

    def test_commutative_ops_match_both_orders(self) -> None:
        r = rng(8)
        pat = UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k")))
        assert match(pat, r + 5) == [{"x": r, "k": c(5)}]
        assert match(pat, UOp(Ops.ADD, I32, (c(5), r))) == [{"x": r, "k": c(5)}]
        for op in (Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR):
            swapped = UOp(op, I32, (c(5), r))
            assert match(UPat(op, src=(UPat.var("x"), UPat.cvar("k"))), swapped) == [{"x": r, "k": c(5)}], op

    def test_non_commutative_ops_match_one_order(self) -> None:
        r = rng(8)
        for op in (Ops.IDIV, Ops.MOD, Ops.CMPLT):
            assert match(UPat(op, src=(UPat.var("x"), UPat.cvar("k"))), UOp(op, I32, (c(5), r))) == [], op
            assert match(UPat(op, src=(UPat.cvar("k"), UPat.var("x"))), UOp(op, I32, (c(5), r))) != [], op

    def test_commutative_yields_every_way_to_match(self) -> None:
        r, s = rng(8), rng(8, 1)
        found = match(UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("b"))), r + s)
        assert {"a": r, "b": s} in found and {"a": s, "b": r} in found


# ---------------------------------------------------------------- PatternMatcher
class TestPatternMatcher:
    def test_first_matching_rule_wins(self) -> None:
        pm = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: c(1)), (UPat(Ops.ADD, name="x"), lambda x: c(2))])
        assert pm.rewrite(rng(4) + 1) is c(1)

    def test_rule_order_holds_across_any_op_and_op_specific_rules(self) -> None:
        pm = PatternMatcher([(UPat(name="x"), lambda x: c(1) if x.op is not Ops.CONST else None),
                             (UPat(Ops.ADD, name="x"), lambda x: c(2))])
        assert pm.rewrite(rng(4) + 1) is c(1)
        pm2 = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: c(2)),
                              (UPat(name="x"), lambda x: c(1) if x.op is not Ops.CONST else None)])
        assert pm2.rewrite(rng(4) + 1) is c(2)
        assert pm2.rewrite(rng(4) * 2) is c(1)

    def test_a_rule_returning_none_lets_later_rules_try(self) -> None:
        pm = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: None), (UPat(Ops.ADD, name="x"), lambda x: c(2))])
        assert pm.rewrite(rng(4) + 1) is c(2)

    def test_a_rule_returning_its_input_is_no_change(self) -> None:
        pm = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: x), (UPat(Ops.ADD, name="x"), lambda x: c(2))])
        assert pm.rewrite(rng(4) + 1) is c(2)

    def test_no_match_gives_none(self) -> None:
        pm = PatternMatcher([(UPat(Ops.MUL, name="x"), lambda x: c(2))])
        assert pm.rewrite(rng(4) + 1) is None

    def test_commutative_match_tries_the_other_order_when_a_rule_declines(self) -> None:
        r, s = rng(8), rng(8, 1)
        pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("b"))),
                              lambda a, b: a * b if a is s else None)])
        assert pm.rewrite(r + s) is s * r

    def test_ctx_is_passed_to_rules_that_ask_for_it(self) -> None:
        seen: list[UOp] = []

        def record(ctx: list[UOp], x: UOp) -> None:
            ctx.append(x)
            return None

        def record_ctx_last(x: UOp, ctx: list[UOp]) -> None:
            ctx.append(x)
            return None
        u = rng(4) + 1
        PatternMatcher([(UPat(Ops.ADD, name="x"), record)]).rewrite(u, seen)
        PatternMatcher([(UPat(Ops.ADD, name="x"), record_ctx_last)]).rewrite(u, seen)
        assert seen == [u, u]

    def test_ctx_maps_nodes(self) -> None:
        r, s = rng(4), rng(4, 1)
        pm = PatternMatcher([(UPat(Ops.RANGE, name="x"), lambda ctx, x: ctx.get(x))])
        assert graph_rewrite(r * 2 + s, pm, {r: c(3)}) is c(3) * 2 + s

    def test_matchers_can_be_added(self) -> None:
        a = PatternMatcher([(UPat(Ops.MUL, name="x"), lambda x: c(1))])
        b = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: c(2))])
        both = a + b
        assert both.rewrite(rng(4) * 3) is c(1) and both.rewrite(rng(4) + 3) is c(2)


# ---------------------------------------------------------------- graph_rewrite
add_zero = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k"))),
                            lambda x, k: x if k.arg == 0 else None)])
fold_consts = PatternMatcher([
    (UPat(Ops.ADD, src=(UPat.cvar("a"), UPat.cvar("b"))), lambda a, b: c(a.arg + b.arg)),
    (UPat(Ops.MUL, src=(UPat.cvar("a"), UPat.cvar("b"))), lambda a, b: c(a.arg * b.arg)),
])


class TestGraphRewrite:
    def test_rewrites_inside_the_graph(self) -> None:
        r = rng(4)
        assert graph_rewrite((r + 0) * 3, add_zero) is r * 3

    def test_reaches_a_fixed_point_bottom_up(self) -> None:
        expr = (c(1) + c(2)) * (c(3) + c(4)) + c(5)
        assert graph_rewrite(expr, fold_consts) is c(26)

    def test_results_of_rules_are_rewritten_too(self) -> None:
        # a rule whose result is itself matched by another rule: x*2 -> x+x, then x+x+... folds constants
        pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("k"))),
                              lambda x, k: x + x if k.arg == 2 else None)]) + fold_consts
        assert graph_rewrite(c(7) * 2, pm) is c(14)
        # a chain of rewrites: SINK arg n -> SINK arg n-1 ... -> 0
        countdown = PatternMatcher([(UPat(Ops.SINK, name="x"),
                                     lambda x: UOp(Ops.SINK, arg=x.arg - 1) if x.arg > 0 else None)])
        assert graph_rewrite(UOp(Ops.SINK, arg=50), countdown) is UOp(Ops.SINK, arg=0)

    def test_shared_nodes_are_rewritten_once(self) -> None:
        calls: list[UOp] = []

        def count(x: UOp) -> None:
            calls.append(x)
            return None
        shared = rng(4) + 1
        graph_rewrite(shared * shared + shared, PatternMatcher([(UPat(Ops.ADD, name="x"), count)]))
        assert calls.count(shared) == 1

    def test_untouched_graph_is_returned_as_is(self) -> None:
        expr = rng(4) * 3 + rng(2, 1)
        assert graph_rewrite(expr, add_zero) is expr

    def test_replacement_sources_that_were_rewritten_are_substituted(self) -> None:
        r = rng(4)
        # the rule for MUL returns a graph that mentions r+0, which add_zero turns into r
        pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("k"))),
                              lambda x, k: (r + 0) * 5 if k.arg == 3 else None)]) + add_zero
        assert graph_rewrite(r * 3, pm) is r * 5

    def test_deep_chain_does_not_hit_the_recursion_limit(self) -> None:
        r = rng(4)
        x = r
        for _ in range(5000):
            x = x + 0
        assert graph_rewrite(x, add_zero) is r

    def test_deep_chain_with_every_node_replaced(self) -> None:
        r = rng(4)
        x = r
        for _ in range(5000):
            x = UOp(Ops.NEG, I32, (x,))
        neg_to_max = PatternMatcher([(UPat(Ops.NEG, src=(UPat.var("x"),)), lambda x: x.maximum(c(0)))])
        out = graph_rewrite(x, neg_to_max)
        depth = 0
        while out is not r:
            assert out.op is Ops.MAX
            out, depth = out.src[0], depth + 1
        assert depth == 5000

    def test_deep_chain_of_rewrites_of_rewrites(self) -> None:
        countdown = PatternMatcher([(UPat(Ops.SINK, name="x"),
                                     lambda x: UOp(Ops.SINK, arg=x.arg - 1) if x.arg > 0 else None)])
        assert graph_rewrite(UOp(Ops.SINK, arg=5000), countdown) is UOp(Ops.SINK, arg=0)

    def test_rules_that_undo_each_other_raise_instead_of_looping(self) -> None:
        flip_flop = PatternMatcher([
            (UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("k"))), lambda x, k: x + x if k.arg == 2 else None),
            (UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x"))), lambda x: x * 2),
        ])
        with pytest.raises(RuntimeError, match="loop"):
            graph_rewrite(rng(4) * 2, flip_flop)


# ---------------------------------------------------------------- substitute
class TestSubstitute:
    def test_a_key_is_looked_up_once_its_sources_are_rewritten(self) -> None:
        a, b = rng(4), rng(8, 1)
        assert substitute(a * 3 + a, {a: b}) is b * 3 + b
        # (a + 1) is not a key once a -> b: the lookup is of b + 1
        assert substitute((a + 1) * 2, {a: b, a + 1: c(7)}) is (b + 1) * 2

    def test_replacements_are_substituted_too(self) -> None:
        a, b = rng(4), rng(8, 1)
        assert substitute(a + 1, {a: b * 2, b: c(3)}) is c(3) * 2 + 1

    def test_unchanged_nodes_are_not_walked_and_the_result_is_the_same(self) -> None:
        a, b, k = rng(4), rng(8, 1), rng(16, 2)
        shared = (b * 5 + 3) // 2  # no key below: found once, for every substitution
        roots = [(a + shared) * (k + shared), a + k]
        unchanged = unchanged_by(roots, {a, k})
        assert shared in unchanged and b in unchanged
        assert a not in unchanged and k not in unchanged and a + shared not in unchanged and roots[1] not in unchanged
        for mapping in ({a: c(1)}, {k: b}, {a: k, k: c(2)}):
            for root in roots:
                assert substitute(root, mapping, unchanged) is substitute(root, mapping)

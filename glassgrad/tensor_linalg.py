"""Formula ops, sorting and matrix factorisations on `Tensor` (a mixin): `einsum`, `rearrange`, `sort`, `argsort`,
`topk`, `qr` and `svd`, built from Tensor's primitives as in tinygrad.

* `einsum` aligns every operand to one sorted alphabet of index letters (a view each), multiplies them (broadcast)
  and sums the letters that are not in the output: one fused reduce kernel. A letter repeated in one operand takes
  that operand's diagonal first (`diagonal`, a view).
* `rearrange` (einops syntax) is reshape -> permute -> reshape.
* `sort` is a bitonic sorting network along the last axis that carries each value's original index with it and
  breaks ties by that index, so the order is total, the result stable, and the indices come for free (tinygrad
  recovers them afterwards with an n x n comparison, which is too much for a 50257-word vocabulary). The length is
  padded to a power of two 2^m; the network has m(m+1)/2 compare-exchange steps, each one elementwise kernel over
  the (values, indices) pair, materialised (`contiguous`) so each step reads the previous one instead of
  recomputing it. Cost: 2 kernels per step (values and indices), so 182 for a row of 8192 and 272 for 50257
  (padded to 65536); see docs/TINYGRAD_PARITY.md for timings.
* `qr` uses Householder reflections (one per column, batched); `svd` runs one-sided Jacobi rotations (round-robin
  pairs of columns, a fixed number of sweeps) on the R of a QR, as tinygrad does (LAPACK Working Note 169).
  Both loops unroll into the graph; every step is `contiguous`, so the graph stays linear in the step count.
"""
from __future__ import annotations

import string
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from glassgrad.dtype import DType, dtypes
from glassgrad.errors import ShapeError
from glassgrad.helpers import normalize_axis, prod

if TYPE_CHECKING:
    from glassgrad.tensor import Tensor

JACOBI_SWEEPS = 6  # one-sided Jacobi converges quadratically; 6 sweeps reach float32 rounding on tested matrices


def _tensor_class() -> type[Tensor]:
    from glassgrad.tensor import Tensor
    return Tensor


class LinalgOps:
    """Mixed into Tensor. Methods use only the public Tensor API."""
    __slots__ = ()

    @property
    def _m(self) -> Tensor:
        """This object as the Tensor it is (for the type checker: the mixin is only ever part of a Tensor)."""
        return cast("Tensor", self)

    @staticmethod
    def einsum(formula: str, *operands: Tensor | Sequence[Tensor], dtype: DType | str | None = None) -> Tensor:
        """Einstein summation, PyTorch's syntax: `Tensor.einsum("ij,jk->ik", a, b)`; operands may also come as one
        list. `...` broadcasts leading dims; a letter repeated in one operand takes its diagonal; without `->` the
        output is the letters used once, sorted (after the `...` dims)."""
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            xs = list(operands[0])
        else:
            xs = [cast("Tensor", x) for x in operands]
        return _einsum(formula, xs, dtype)

    # ------------------------------------------------------------------ sorting
    def sort(self, dim: int = -1, descending: bool = False, *, stable: bool = False) -> tuple[Tensor, Tensor]:
        """(sorted values, int32 indices into `dim`), stable (equal values keep their order) whatever PyTorch's
        `stable=` keyword says. A bitonic network; NaN sorts as the largest value (last ascending, first
        descending), as in PyTorch."""
        t = self._m
        tensor = _tensor_class()
        if t.ndim == 0:
            normalize_axis(dim, 0, "dim")
            return t, tensor.zeros((), dtype=dtypes.int32, device=t.device)
        a = normalize_axis(dim, t.ndim, "dim")
        n = t.shape[a]
        if n <= 1:
            return t, t.zeros_like(dtypes.int32)
        moved = t.transpose(a, -1) if a != t.ndim - 1 else t
        rows = moved.reshape(-1, n)
        values, indices = _bitonic(rows, descending)
        values, indices = values.reshape(moved.shape), indices.reshape(moved.shape)
        if a != t.ndim - 1:
            values, indices = values.transpose(a, -1), indices.transpose(a, -1)
        return values, indices

    def argsort(self, dim: int = -1, descending: bool = False, *, stable: bool = False) -> Tensor:
        """The indices `sort` gives (stable, as PyTorch's `stable=True`)."""
        return self._m.sort(dim, descending)[1]

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True, *,
             sorted: bool = True) -> tuple[Tensor, Tensor]:  # noqa: A002  (PyTorch's keyword)
        """(the k largest (or smallest) values along `dim`, sorted, and their int32 indices); ties keep their
        original order. `sorted_=False` is not supported (as in tinygrad); PyTorch's `sorted=False` leaves the
        order unspecified, so the sorted result is its answer too."""
        t = self._m
        if not sorted_:
            raise NotImplementedError("topk with sorted_=False is not supported; the result is always sorted")
        a = normalize_axis(dim, max(t.ndim, 1), "dim")
        size = t.shape[a] if t.ndim else 1
        if not isinstance(k, int) or not 0 <= k <= size:
            raise ValueError(f"topk: k={k!r} is out of range for dim {dim} of size {size}")
        if t.ndim == 0:
            return t.sort(a, descending=largest)
        if k <= _select_limit(size):
            return _topk_by_selection(t, k, a, largest)
        values, indices = t.sort(a, descending=largest)
        bounds = tuple((0, k) if i == a else None for i in range(t.ndim))
        return values.shrink(bounds), indices.shrink(bounds)

    # ------------------------------------------------------------------ factorisations
    def qr(self) -> tuple[Tensor, Tensor]:
        """(Q, R) with self = Q @ R for (..., m, n): Q (..., m, m) orthogonal, R (..., m, n) upper triangular
        (tinygrad's full form; torch.linalg.qr(mode='complete')). Householder reflections."""
        t = self._m
        if t.ndim < 2:
            raise ValueError(f"qr needs a matrix (at least 2 dims), got shape {t.shape}")
        if not t.dtype.is_float:
            t = t.float()
        return _householder_qr(t)

    def svd(self, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """(U, S, Vh) with self = U @ diag(S) @ Vh for (..., m, n); S descending. full_matrices=False keeps the
        first min(m, n) columns of U (and rows of Vh when n > m, as torch.linalg.svd). One-sided Jacobi."""
        t = self._m
        if t.ndim < 2:
            raise ValueError(f"svd needs a matrix (at least 2 dims), got shape {t.shape}")
        if not t.dtype.is_float:
            t = t.float()
        m, n = t.shape[-2], t.shape[-1]
        if m >= n:
            u, s, v = _jacobi_svd(t, full_matrices)
            return u, s, v.transpose(-2, -1)
        u, s, v = _jacobi_svd(t.transpose(-2, -1), full_matrices)
        return v, s, u.transpose(-2, -1)


# ---------------------------------------------------------------------- einsum
def _einsum(formula: str, xs: list[Tensor], dtype: DType | str | None) -> Tensor:
    formula = formula.replace(" ", "")
    lhs, arrow, rhs = formula.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != len(xs):
        raise ShapeError(f"einsum: formula {formula!r} has {len(inputs)} operands, got {len(xs)} tensors")
    inputs, rhs = _expand_ellipsis(formula, inputs, rhs if arrow else None, xs)
    for spec, x in zip(inputs, xs):
        if not spec.isalpha() and spec:
            raise ShapeError(f"einsum: operand spec {spec!r} of {formula!r} may hold only letters (and one ...)")
        if len(spec) != x.ndim:
            raise ShapeError(f"einsum: spec {spec!r} names {len(spec)} dims, its operand has shape {x.shape}")
    if len(set(rhs)) != len(rhs) or any(c not in "".join(inputs) for c in rhs):
        raise ShapeError(f"einsum: output {rhs!r} must use distinct letters of the inputs ({formula!r})")
    pairs = [_take_diagonals(spec, x) for spec, x in zip(inputs, xs)]
    sizes: dict[str, int] = {}
    for spec, x in pairs:
        for c, s in zip(spec, x.shape):
            seen = sizes.get(c, 1)
            if seen != 1 and s not in (1, seen):
                raise ShapeError(f"einsum: letter {c!r} has sizes {seen} and {s} ({formula!r})")
            sizes[c] = s if seen == 1 else seen  # size-1 dims broadcast
    alphabet = sorted(sizes)
    aligned = []
    for spec, x in pairs:
        x = x.permute([spec.index(c) for c in sorted(spec)]) if spec else x
        aligned.append(x.reshape([x.shape[sorted(spec).index(c)] if c in spec else 1 for c in alphabet]))
    aligned = [x._product_operand(dtype) for x in aligned] if len(aligned) > 1 else aligned
    product = aligned[0]
    for x in aligned[1:]:
        product = product * x
    product = product._broadcast_to(tuple(sizes[c] for c in alphabet))
    summed = [i for i, c in enumerate(alphabet) if c not in rhs]
    out = product.sum(summed, dtype=dtype) if summed or dtype is not None else product
    kept = [c for c in alphabet if c in rhs]
    return out.permute([kept.index(c) for c in rhs]) if rhs else out


def _expand_ellipsis(formula: str, inputs: list[str], rhs: str | None, xs: list[Tensor]) -> tuple[list[str], str]:
    """Replace `...` by fresh letters (right-aligned, numpy broadcasting) and work out an implicit output."""
    spare = [c for c in string.ascii_letters if c not in formula]
    counts = []
    for spec, x in zip(inputs, xs):
        if spec.count("...") > 1:
            raise ShapeError(f"einsum: operand spec {spec!r} has more than one ...")
        counts.append(x.ndim - (len(spec) - 3) if "..." in spec else 0)
        if counts[-1] < 0:
            raise ShapeError(f"einsum: spec {spec!r} names more dims than its operand's shape {x.shape}")
    width = max(counts, default=0)
    ell = "".join(spare[:width])
    inputs = [spec.replace("...", ell[width - k:]) for spec, k in zip(inputs, counts)]
    if rhs is None:
        letters = "".join(inputs)
        single = sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell)
        return inputs, ell + "".join(single)
    return inputs, rhs.replace("...", ell)


def _take_diagonals(spec: str, x: Tensor) -> tuple[str, Tensor]:
    """A letter repeated in one operand ("ii", "iij") -> that diagonal, the letter kept once, at the end."""
    for c in sorted(set(spec)):
        while spec.count(c) > 1:
            i = spec.index(c)
            j = spec.index(c, i + 1)
            if x.shape[i] != x.shape[j]:
                raise ShapeError(f"einsum: repeated letter {c!r} spans dims of sizes {x.shape[i]} and {x.shape[j]}")
            x = x.diagonal(0, i, j)
            spec = "".join(ch for k, ch in enumerate(spec) if k not in (i, j)) + c
    return spec, x


# ---------------------------------------------------------------------- rearrange
ELLIPSIS_DIMS = "..."  # an ungrouped `...`: the dims it covers stay dims of their own
ELLIPSIS_GROUP = "(...)"  # `...` inside parentheses: those dims as one group


def _parse_side(side: str, formula: str) -> list[list[str]]:
    """"b (h w) 1 ..." -> [["b"], ["h", "w"], [], ["..."]]: one list of axis names per dimension (a `...` inside
    parentheses is named "(...)")."""
    groups: list[list[str]] = []
    current: list[str] | None = None
    for token in side.replace("(", " ( ").replace(")", " ) ").replace("…", "...").split():
        if token == "(":
            if current is not None:
                raise ValueError(f"rearrange: nested parentheses in {formula!r}")
            current = []
        elif token == ")":
            if current is None:
                raise ValueError(f"rearrange: unbalanced parentheses in {formula!r}")
            groups.append(current)
            current = None
        elif token == "1":  # a size-1 dim of its own; inside a group it contributes nothing
            if current is None:
                groups.append([])
        elif token == "..." or token.isidentifier():
            if current is not None:
                current.append(ELLIPSIS_GROUP if token == "..." else token)
            else:
                groups.append([token])
        else:
            raise ValueError(f"rearrange: {token!r} is not an axis name in {formula!r}")
    if current is not None:
        raise ValueError(f"rearrange: unbalanced parentheses in {formula!r}")
    return groups


def rearrange(t: Tensor, formula: str, sizes: dict[str, int]) -> Tensor:
    """einops.rearrange for one tensor (see Tensor.rearrange)."""
    if formula.count("->") != 1:
        raise ValueError(f"rearrange needs exactly one '->' in {formula!r}")
    left, right = (_parse_side(s, formula) for s in formula.split("->"))
    names_l = [ELLIPSIS_DIMS if n == ELLIPSIS_GROUP else n for g in left for n in g]
    names_r = [ELLIPSIS_DIMS if n == ELLIPSIS_GROUP else n for g in right for n in g]
    if sorted(names_l) != sorted(names_r) or len(set(names_l)) != len(names_l):
        raise ValueError(f"rearrange: both sides must name the same distinct axes in {formula!r}")
    if any(n == ELLIPSIS_GROUP for g in left for n in g):
        raise ValueError(f"rearrange: ... cannot be grouped on the left of {formula!r}")
    for name in sizes:
        if name not in names_l:
            raise ValueError(f"rearrange: size given for {name!r}, which {formula!r} does not use")
    if "..." in names_l:
        left, right = _expand_rearrange_ellipsis(left, right, t.ndim, formula)
    if len(left) != t.ndim:
        raise ValueError(f"rearrange: the left of {formula!r} names {len(left)} dims, the tensor has shape {t.shape}")
    axis_size = _axis_sizes(left, t.shape, sizes, formula)
    order = [n for g in left for n in g]
    x = t.reshape([axis_size[n] for n in order])
    x = x.permute([order.index(n) for g in right for n in g])
    return x.reshape([prod(axis_size[n] for n in g) for g in right])


def _expand_rearrange_ellipsis(left: list[list[str]], right: list[list[str]], ndim: int,
                               formula: str) -> tuple[list[list[str]], list[list[str]]]:
    """`...` on the left stands for the dims no name covers, each its own axis ("...0", "...1", ...); on the right
    it is those axes, each a dim of its own, or all of them inside a group."""
    count = ndim - (len(left) - 1)
    if count < 0:
        raise ValueError(f"rearrange: {formula!r} names more dims than the tensor has ({ndim})")
    ell = [f"...{i}" for i in range(count)]
    new_left: list[list[str]] = []
    for g in left:
        new_left.extend([[n] for n in ell] if g == ["..."] else [g])
    new_right: list[list[str]] = []
    for g in right:
        if g == ["..."]:
            new_right.extend([n] for n in ell)
        else:
            new_right.append([n for x in g for n in (ell if x == ELLIPSIS_GROUP else [x])])
    return new_left, new_right


def _axis_sizes(left: list[list[str]], shape: tuple[int, ...], sizes: dict[str, int], formula: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for group, dim in zip(left, shape):
        unknown = [n for n in group if n not in sizes]
        known = prod(sizes[n] for n in group if n in sizes)
        if len(unknown) > 1:
            raise ValueError(f"rearrange: give sizes for all but one of {group} in {formula!r}")
        if (unknown and (known == 0 or dim % known)) or (not unknown and known != dim):
            raise ValueError(f"rearrange: axes {group} with sizes {sizes} do not fit dimension of size {dim}")
        for n in group:
            out[n] = sizes[n] if n in sizes else dim // known
    return out


# ---------------------------------------------------------------------- bitonic sort
def _bitonic(rows: Tensor, descending: bool) -> tuple[Tensor, Tensor]:
    """rows (B, n) -> (values, int32 indices), each row sorted; NaN counts as the largest value (last ascending,
    first descending), as in PyTorch and numpy. Padding to 2^m uses the dtype's extreme (NaN ascending) and indices
    past n, so it sorts last."""
    tensor = _tensor_class()
    batch, n = rows.shape
    size = 1 << (n - 1).bit_length()
    pad_value: Any = (-float("inf") if rows.dtype.is_float else rows.dtype.min) if descending else \
        (float("nan") if rows.dtype.is_float else rows.dtype.max)
    values = rows.pad(((0, 0), (0, size - n)), value=pad_value) if size > n else rows
    indices = tensor.arange(size, device=rows.device).reshape(1, size).expand(batch, size).cast(dtypes.int32)
    block = 2
    while block <= size:
        values, indices = _exchange(values, indices, block // 2, descending, mirror=True)
        step = block // 4
        while step >= 1:
            values, indices = _exchange(values, indices, step, descending, mirror=False)
            step //= 2
        block *= 2
    bounds = ((0, batch), (0, n))
    return values.shrink(bounds), indices.shrink(bounds)


def _exchange(values: Tensor, indices: Tensor, half: int, descending: bool, mirror: bool) -> tuple[Tensor, Tensor]:
    """One step of the network: element pairs `half` apart in blocks of 2*half (mirror: the block's first half
    against its second half reversed) are put in order, (value, index) lexicographically."""
    batch, size = values.shape
    shape = (batch, size // (2 * half), 2, half)
    v, i = values.reshape(shape), indices.reshape(shape)
    bounds_top = ((0, batch), (0, shape[1]), (0, 1), (0, half))
    bounds_bottom = ((0, batch), (0, shape[1]), (1, 2), (0, half))
    v_top, v_bottom = v.shrink(bounds_top), v.shrink(bounds_bottom)
    i_top, i_bottom = i.shrink(bounds_top), i.shrink(bounds_bottom)
    if mirror:
        v_bottom, i_bottom = v_bottom.flip(-1), i_bottom.flip(-1)
    first = (v_bottom > v_top) if descending else (v_bottom < v_top)
    equal = v_bottom == v_top
    if values.dtype.is_float:  # NaN is the largest value (a comparison with it is false, which broke the network)
        nan_bottom, nan_top = v_bottom.isnan(), v_top.isnan()
        first = first | ((nan_bottom & nan_top.logical_not()) if descending else (nan_top & nan_bottom.logical_not()))
        equal = equal | (nan_bottom & nan_top)
    swap = first | (equal & (i_bottom < i_top))
    new_v = (swap.where(v_bottom, v_top), swap.where(v_top, v_bottom))
    new_i = (swap.where(i_bottom, i_top), swap.where(i_top, i_bottom))
    if mirror:
        new_v, new_i = (new_v[0], new_v[1].flip(-1)), (new_i[0], new_i[1].flip(-1))
    # contiguous both ways: the forward step reads the previous one's buffer, and so does its gradient (without
    # contiguous_backward the backward pass would be one kernel holding the whole network)
    out_v = new_v[0].cat(new_v[1], dim=2).reshape(batch, size).contiguous().contiguous_backward()
    out_i = new_i[0].cat(new_i[1], dim=2).reshape(batch, size).contiguous()
    return out_v, out_i


# ---------------------------------------------------------------------- top-k by repeated selection
def _select_limit(n: int) -> int:
    """Largest k for which topk picks k maxima one by one (3 kernels each, the same 3 every round, so compiled
    once) rather than sorting (2 distinct kernels per step of the bitonic network, m(m+1)/2 steps for 2^m >= n)."""
    steps = (n - 1).bit_length() * ((n - 1).bit_length() + 1) // 2
    return max(1, (2 * steps) // 3)


def _topk_by_selection(t: Tensor, k: int, axis: int, largest: bool) -> tuple[Tensor, Tensor]:
    """k rounds of: the max of the elements not taken yet, the first untaken position holding it (so ties keep
    their order, and NaN counts as the largest, as in PyTorch: first for the largest, last for the smallest), mark it
    taken. Values are gathered at the
    indices, so gradients reach exactly those elements."""
    tensor = _tensor_class()
    moved = t.transpose(axis, -1) if axis != t.ndim - 1 else t
    n = moved.shape[-1]
    rows = moved.reshape(-1, n)
    key = rows if largest else (-rows if rows.dtype.is_float else rows.bitwise_not())
    key = key.detach()
    lowest: Any = -float("inf") if key.dtype.is_float else key.dtype.min
    positions = tensor.arange(n, device=t.device).reshape(1, n).cast(dtypes.int32)
    taken = tensor.zeros(rows.shape, dtype=dtypes.bool, device=t.device)
    picked = []
    nans = rows.detach().isnan() if key.dtype.is_float and not largest else None
    for _ in range(k):
        candidates = taken.logical_not()
        if nans is not None:  # the smallest: NaN is the largest value, taken only once no number is left
            numbers = candidates & nans.logical_not()
            candidates = numbers.any(-1, keepdim=True).where(numbers, candidates)
        best = candidates.where(key, lowest).max(-1, keepdim=True)
        hit = candidates & (key == best)
        if key.dtype.is_float:
            hit = hit | (candidates & key.isnan() & best.isnan())
        index = hit.where(positions, n).min(-1, keepdim=True)
        picked.append(index)
        taken = (taken | (positions == index)).contiguous()
    indices = picked[0].cat(*picked[1:], dim=-1) if k else positions.shrink(((0, 1), (0, 0))).expand(rows.shape[0], 0)
    values = rows.gather(-1, indices)
    values, indices = values.reshape(*moved.shape[:-1], k), indices.reshape(*moved.shape[:-1], k)
    if axis != t.ndim - 1:
        values, indices = values.transpose(axis, -1), indices.transpose(axis, -1)
    return values, indices


# ---------------------------------------------------------------------- QR and SVD
def _householder_qr(a: Tensor) -> tuple[Tensor, Tensor]:
    """Q (..., m, m), R (..., m, n): R <- H R and Q <- Q H for one reflector H = I - tau v v^T per column, which
    zeroes that column below the diagonal (v[i] = 1, v = 0 above i)."""
    tensor = _tensor_class()
    batch, m, n = a.shape[:-2], a.shape[-2], a.shape[-1]
    r = a
    q = tensor.eye(m, dtype=a.dtype, device=a.device).reshape((1,) * len(batch) + (m, m)).expand(*batch, m, m)
    rows = tensor.arange(m, device=a.device)
    for i in range(min(m, n)):
        column = (rows >= i).where(r[..., :, i], 0.0)  # (..., m), zeros above row i
        norm = (column * column).sum(-1, keepdim=True).sqrt()
        x0 = r[..., i:i + 1, i]  # (..., 1)
        sign = (x0 < 0).where(-1.0, 1.0)
        u0 = x0 + sign * norm
        active = norm != 0
        safe_u0 = active.where(u0, 1.0)
        v = (rows == i).where(1.0, column / safe_u0).unsqueeze(-1)  # (..., m, 1)
        tau = active.where(sign * u0 / active.where(norm, 1.0), 0.0).unsqueeze(-1)  # (..., 1, 1)
        r = (r - (tau * v) @ (v.transpose(-2, -1) @ r)).contiguous().contiguous_backward()
        q = (q - (q @ v) @ (tau * v).transpose(-2, -1)).contiguous().contiguous_backward()
    return q, r.triu()


def _round_robin(num: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint column pairs that meet every pair once (the circle method); odd counts sit one out."""
    players = list(range(num)) + ([-1] if num % 2 else [])
    rounds = []
    for _ in range(len(players) - 1):
        half = len(players) // 2
        pairs = [(players[k], players[-1 - k]) for k in range(half)]
        rounds.append([(min(p), max(p)) for p in pairs if -1 not in p])
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def _selectors(pairs: list[tuple[int, int]], num: int, dtype: DType, device: str) -> tuple[Tensor, Tensor]:
    """(num, h) one-hot matrices that pick the left and right column of each pair."""
    tensor = _tensor_class()
    left = np.zeros((num, len(pairs)), dtype=np.float32)
    right = np.zeros((num, len(pairs)), dtype=np.float32)
    for k, (i, j) in enumerate(pairs):
        left[i, k], right[j, k] = 1.0, 1.0
    return tensor(left, device=device).cast(dtype), tensor(right, device=device).cast(dtype)


def _jacobi_round(u: Tensor, v: Tensor, left: Tensor, right: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate each pair (i, j) of u's columns so they become orthogonal, and v's the same way."""
    ul, ur = u @ left, u @ right  # (..., rows, h)
    alpha, beta, gamma = (ul * ul).sum(-2), (ur * ur).sum(-2), (ul * ur).sum(-2)  # (..., h)
    rotate = gamma != 0
    zeta = (beta - alpha) / (2 * rotate.where(gamma, 1.0))
    tangent = (zeta < 0).where(-1.0, 1.0) / (zeta.abs() + (1 + zeta * zeta).sqrt())
    tangent = rotate.where(tangent, 0.0)
    cos = (1 + tangent * tangent).rsqrt()
    sin = cos * tangent
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)

    def apply(x: Tensor) -> Tensor:
        xl, xr = x @ left, x @ right
        new_l, new_r = cos * xl - sin * xr, sin * xl + cos * xr
        lt, rt = left.transpose(-2, -1), right.transpose(-2, -1)
        return (x + (new_l - xl) @ lt + (new_r - xr) @ rt).contiguous().contiguous_backward()

    return apply(u), apply(v)


def _jacobi_svd(a: Tensor, full_matrices: bool) -> tuple[Tensor, Tensor, Tensor]:
    """For m >= n: (U (..., m, m or n), S (..., n), V (..., n, n)) with a = U diag(S) V^T."""
    tensor = _tensor_class()
    batch, m, n = a.shape[:-2], a.shape[-2], a.shape[-1]
    q, r = a.qr()
    u = r[..., :n, :].contiguous()  # (..., n, n): a = q [u; 0]
    eye = tensor.eye(n, dtype=a.dtype, device=a.device).reshape((1,) * len(batch) + (n, n))
    v = eye.expand(*batch, n, n).contiguous()
    rounds = _round_robin(n)
    selectors = [_selectors(pairs, n, a.dtype, a.device) for pairs in rounds if pairs]
    for _ in range(JACOBI_SWEEPS):
        for left, right in selectors:
            u, v = _jacobi_round(u, v, left, right)
    norms = (u * u).sum(-2).sqrt()  # (..., n): the singular values, unordered
    s, order = norms.sort(-1, descending=True)
    gather_index = order.unsqueeze(-2).expand(*batch, n, n)
    u = u.gather(-1, gather_index) / (s != 0).where(s, 1.0).unsqueeze(-2)
    v = v.gather(-1, gather_index)
    # a = q [u_small; 0] diag(s) v^T, so U = q @ blockdiag(u_small, I)
    block = u.pad(((0, 0),) * len(batch) + ((0, m - n), (0, m - n)))
    corner = tensor.eye(m, dtype=a.dtype, device=a.device) - tensor.eye(n, dtype=a.dtype, device=a.device).pad(
        ((0, m - n), (0, m - n)))
    full_u = q @ (block + corner)
    return (full_u if full_matrices else full_u[..., :, :n]), s, v

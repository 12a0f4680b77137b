"""Mixed precision: float16/bfloat16 compute over float32 parameters (`autocast`), and a loss scaler for float16
(`GradScaler`), with PyTorch's names and semantics.

    from glassgrad import amp, dtypes
    scaler = amp.GradScaler()                   # float16 only; bfloat16 needs no scaling
    with Tensor.train():
        opt.zero_grad()
        with amp.autocast(dtypes.float16):
            loss = model(x).sparse_categorical_crossentropy(y)
        scaler.scale(loss).backward()
        scaler.step(opt)                         # unscale, check for inf/NaN, step or skip
        scaler.update()                          # back off or grow the scale

autocast. In: a half dtype (float16 or bfloat16). While the context is active, the layers that call this module's
functions (`nn.Linear`, `glassgrad.models.gpt2`) compute in that dtype: `linear` and `matmul` cast their float
inputs, weights and biases to it, so the products run on tensor cores on CUDA (float32 accumulation inside the
reduction) and come out in the half dtype; `attention` multiplies in the half dtype and takes the softmax in float32.
Everything else keeps its dtype: LayerNorm, the loss, the residual stream (float32 + half promotes to float32), the
embedding. The parameters stay float32 (the *master weights* the optimiser updates); each forward reads them through
a cast, whose gradient casts back, so every parameter's `.grad` is float32. Outside the context (or with
`enabled=False`) these functions are exactly `Tensor.linear`, `@` and `scaled_dot_product_attention`. The setting is
read while the graph is built: under `TinyJit`, enter the context inside the jitted function.

GradScaler. In: the float32 loss, an optimiser whose params' `.grad` came from `scale(loss).backward()`. Out:
`step(opt)` divides the gradients by the scale (in place of `.grad`, as PyTorch's `unscale_`), and applies the
optimiser's update unless some gradient holds an inf or NaN, in which case every param and every piece of optimiser
state keeps its value; `update()` then halves the scale after such a step, or doubles it after `growth_interval`
good steps in a row (never to infinity). All of it happens on the device (the skip is a `where` on a bool tensor,
the scale and the count of good steps are device buffers updated with `assign`), so there is no host sync per step
and a whole step works inside `TinyJit`: realize `scaler.schedule_step(opt)` and `scaler.schedule_update()` with the
loss (see `examples/gpt2.py`).
"""
from __future__ import annotations

import contextvars
import functools
import math
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from glassgrad.device import Device
from glassgrad.dtype import DType, dtypes, to_dtype
from glassgrad.tensor import Tensor, no_grad
from glassgrad.tensor_nn import attention_output

__all__ = ["autocast", "compute_dtype", "linear", "matmul", "attention", "GradScaler", "HALF_DTYPES"]

HALF_DTYPES = (dtypes.float16, dtypes.bfloat16)
_COMPUTE: contextvars.ContextVar[DType | None] = contextvars.ContextVar("glassgrad_autocast", default=None)
F = TypeVar("F", bound=Callable[..., Any])


# ---------------------------------------------------------------------- autocast
class autocast:  # noqa: N801 (PyTorch's name)
    """`with autocast(dtypes.bfloat16):` (or as a decorator) -- linear layers, matmuls and attention compute in the
    half dtype while it is active. `enabled=False` turns it off inside an outer one. Nests; thread- and
    task-local (a ContextVar)."""

    def __init__(self, dtype: DType | str = dtypes.bfloat16, enabled: bool = True) -> None:
        dt = to_dtype(dtype)
        if dt not in HALF_DTYPES:
            raise ValueError(f"autocast: the compute dtype must be float16 or bfloat16, got {dt}")
        self.dtype, self.enabled = dt, enabled
        self._tokens: list[contextvars.Token[DType | None]] = []

    def __enter__(self) -> autocast:
        self._tokens.append(_COMPUTE.set(self.dtype if self.enabled else None))
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        _COMPUTE.reset(self._tokens.pop())

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with autocast(self.dtype, self.enabled):
                return fn(*args, **kwargs)
        return wrapped  # type: ignore[return-value]


def compute_dtype() -> DType | None:
    """The active autocast dtype, or None outside autocast."""
    return _COMPUTE.get()


def _to(t: Tensor, dt: DType) -> Tensor:
    """t in dt when t is a float tensor (ints and bools pass: masks, ids). A cast is stored (`contiguous`), as
    PyTorch's autocast stores its casts: a matmul that reads float32 and converts while copying its tiles cannot use
    the GPU's asynchronous 16-byte copies (cp.async), and one that reads the stored half values can; the weights'
    copies are then made once a step, not in every matmul that reads them (forward, input and weight gradients)."""
    if not t.dtype.is_float or t.dtype == dt:
        return t
    return t.cast(dt).contiguous()


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`x.linear(weight, bias)` (weight (in, out)); under autocast all three in the compute dtype, out too."""
    dt = _COMPUTE.get()
    if dt is None:
        return x.linear(weight, bias)
    return _to(x, dt).linear(_to(weight, dt), None if bias is None else _to(bias, dt))


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """`a @ b`; under autocast both factors (and the result) in the compute dtype, accumulated in float32."""
    dt = _COMPUTE.get()
    return a @ b if dt is None else _to(a, dt) @ _to(b, dt)


def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    """`q.scaled_dot_product_attention(k, v, attn_mask, is_causal=...)`. Under autocast, spelled out as PyTorch's
    autocast runs it: scores = q @ k^T in the compute dtype, then scale, mask and softmax in float32, and the
    probabilities (back in the compute dtype) @ v. Out: (..., L, Ev) in the compute dtype."""
    dt = _COMPUTE.get()
    if dt is None:
        return q.scaled_dot_product_attention(k, v, attn_mask=attn_mask, is_causal=is_causal)
    if is_causal and attn_mask is not None:
        raise ValueError("attention: pass attn_mask or is_causal, not both")
    if is_causal:
        rows = Tensor.arange(q.shape[-2], device=q.device).reshape(-1, 1)
        attn_mask = rows >= Tensor.arange(k.shape[-2], device=q.device).reshape(1, -1)
    scores = (_to(q, dt) @ _to(k, dt).transpose(-1, -2)).float() * (1 / math.sqrt(q.shape[-1]))
    if attn_mask is not None:
        scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype == dtypes.bool else scores + attn_mask.float()
    return attention_output(scores, _to(v, dt), q.shape[-1], dt, dt)


# ---------------------------------------------------------------------- loss scaling
class GradScaler:
    """PyTorch's `torch.amp.GradScaler`, decided on the device: scale (init_scale), growth_factor, backoff_factor,
    growth_interval. `enabled=False` makes every method a pass-through (bfloat16 and float32 training)."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True, device: str | None = None) -> None:
        if not (init_scale > 0 and math.isfinite(init_scale)):
            raise ValueError(f"GradScaler: init_scale must be a finite number > 0, got {init_scale}")
        if not growth_factor > 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"GradScaler: growth_interval must be an int >= 1, got {growth_interval!r}")
        self.enabled = enabled
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.device = Device.canonicalize(device or Device.DEFAULT)
        with no_grad():
            self._scale = Tensor.empty(dtype=dtypes.float32, device=self.device).assign(float(init_scale)).realize()
            self._growth_tracker = Tensor.empty(dtype=dtypes.int32, device=self.device).assign(0).realize()
        self._found_inf: Tensor | None = None       # this iteration's check, set by unscale_
        self._unscaled: set[int] = set()            # ids of the optimisers unscaled since the last update

    # ------------------------------------------------------------------ the loss and the gradients
    def scale(self, loss: Tensor) -> Tensor:
        """loss * scale (the scale as a float32 device tensor), to call `.backward()` on."""
        if not self.enabled:
            return loss
        if loss.device != self.device:
            raise ValueError(f"GradScaler.scale: the loss is on {loss.device}, the scaler on {self.device} "
                             "(pass device= to GradScaler)")
        return loss * self._scale.cast(loss.dtype)

    def unscale_(self, optimizer: Any) -> None:
        """Divide every param's `.grad` by the scale (lazily, replacing `.grad`) and note whether any of them holds
        an inf or NaN. Once per optimiser per iteration (PyTorch's rule); call it before clipping gradients."""
        if not self.enabled:
            return
        if id(optimizer) in self._unscaled:
            raise RuntimeError("GradScaler.unscale_() has already been called on this optimizer since the last "
                               "update()")
        params = _params_of(optimizer)
        inv = self._scale.reciprocal()
        flags = []
        for i, p in enumerate(params):
            if p.grad is None:
                raise RuntimeError(f"GradScaler: optimizer param {i} (shape {p.shape}) has no gradient: call "
                                   "scaler.scale(loss).backward() first")
            if p.device != self.device:
                raise ValueError(f"GradScaler: param {i} is on {p.device}, the scaler on {self.device}")
            p.grad = p.grad * inv.cast(p.grad.dtype)
            flags.append(p.grad.isfinite().logical_not().any())
        found = functools.reduce(lambda a, b: a | b, flags)
        self._found_inf = found if self._found_inf is None else self._found_inf | found
        self._unscaled.add(id(optimizer))

    def schedule_step(self, optimizer: Any) -> list[Tensor]:
        """Unscale (unless done), queue the optimiser's update, skipped on the device where a gradient is not
        finite; the tensors to realize for it (for TinyJit steps)."""
        if not self.enabled:
            return list(optimizer.schedule_step())
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        assert self._found_inf is not None
        return [*optimizer.schedule_step(skip=self._found_inf), self._found_inf]

    def step(self, optimizer: Any) -> None:
        """`optimizer.step()` unless a gradient holds an inf or NaN (then nothing changes); realized now."""
        with no_grad():
            Tensor.realize_all(*self.schedule_step(optimizer))

    # ------------------------------------------------------------------ the scale
    def schedule_update(self) -> list[Tensor]:
        """Queue the scale's update from this iteration's check (PyTorch's `_amp_update_scale_`): inf/NaN found ->
        scale *= backoff_factor and the count of good steps = 0; else the count + 1, and at growth_interval
        scale *= growth_factor (kept when that is infinite) and the count = 0. The tensors to realize."""
        if not self.enabled:
            return []
        if self._found_inf is None:
            raise RuntimeError("GradScaler.update(): no step since the last update (call scaler.step(optimizer) "
                               "first)")
        found, scale, tracker = self._found_inf, self._scale, self._growth_tracker
        with no_grad():
            good = tracker + 1
            grow = (good >= self.growth_interval) & found.logical_not()
            grown = scale * self.growth_factor
            new_scale = found.where(scale * self.backoff_factor, grow.where(grown.isfinite().where(grown, scale),
                                                                            scale))
            new_tracker = (found | grow).where(0, good)
            self._scale.assign(new_scale)
            self._growth_tracker.assign(new_tracker)
        self._found_inf, self._unscaled = None, set()
        return [self._scale, self._growth_tracker]

    def update(self) -> None:
        """Apply `schedule_update()` now."""
        with no_grad():
            Tensor.realize_all(*self.schedule_update())

    def get_scale(self) -> float:
        """The current scale (a host sync); 1.0 when disabled."""
        return float(self._scale.item()) if self.enabled else 1.0

    @property
    def scale_tensor(self) -> Tensor:
        """The scale as a float32 device tensor (no sync)."""
        return self._scale

    def state_dict(self) -> dict[str, float | int]:
        """PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker (host values)."""
        if not self.enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "_growth_tracker": int(self._growth_tracker.item())}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        if not self.enabled:
            return
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        with no_grad():
            Tensor.realize_all(self._scale.assign(float(state["scale"])),
                               self._growth_tracker.assign(int(state["_growth_tracker"])))


def _params_of(optimizer: Any) -> list[Tensor]:
    params = getattr(optimizer, "params", None)
    if not isinstance(params, list):
        raise TypeError(f"GradScaler needs an optimizer with a `params` list, got {type(optimizer).__name__}")
    return params

"""`@function`: tinygrad's decorator for a function of tensors that is called many times (`Model.__call__`).

In: a function (or method) of tensors. Out: the same function. tinygrad captures such a call as one reusable node of
its graph; glassgrad runs it as it is, since its schedule cache already reuses the schedule of every graph shaped like
an earlier one (schedule/cache.py) and TinyJit replays whole steps. So a tinygrad program that decorates its model with
`@function` runs unchanged, with the same values. The keyword arguments tinygrad takes are accepted and checked for type
only (they tune tinygrad's capture, which has no counterpart here), except `grad_fxn`: a custom gradient (written on
tinygrad's UOps) that glassgrad cannot apply, so it raises NotImplementedError rather than be ignored (the gradient
would silently be the function's own, not the custom one: a straight-through estimator's would be wrong).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_FLAGS = ("precompile", "precompile_backward", "allow_implicit")


def function(fxn: F | None = None, **options: Any) -> Any:
    """`@function` or `@function(precompile=True, ...)`: returns the function itself (see the module docstring)."""
    unknown = set(options) - {*_FLAGS, "grad_fxn"}
    if unknown:
        raise TypeError(f"function() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    if options.get("grad_fxn") is not None:
        raise NotImplementedError("function(grad_fxn=...): a custom gradient on tinygrad's UOps is not supported; "
                                  "glassgrad differentiates the function's own ops (drop grad_fxn if that gradient "
                                  "is the one wanted)")
    for flag in _FLAGS:
        if flag in options and not isinstance(options[flag], bool):
            raise TypeError(f"function({flag}=...) must be a bool, got {options[flag]!r}")
    if fxn is None:
        return functools.partial(function, **options)
    if not callable(fxn):
        raise TypeError(f"@function decorates a function, got {type(fxn).__name__}")
    return fxn

"""Exception types for bad input that both glassgrad's and tinygrad's/PyTorch's callers can catch.

glassgrad raises `ValueError` for bad shapes and arguments, `TypeError` for bad dtypes and `IndexError` for bad
indices. PyTorch (and tinygrad, which follows it) raise `RuntimeError` for most of the same mistakes, and tinygrad
`AttributeError` for an unknown dtype name. A program written for either must see the exception it expects, so
each class below derives from both: `except ValueError` and `except RuntimeError` both catch a `ShapeError`.
"""
from __future__ import annotations


class ShapeError(ValueError, RuntimeError):
    """Shapes, axes or sizes that do not fit the op (PyTorch and tinygrad raise RuntimeError for these)."""


class ArgumentError(ValueError, RuntimeError):
    """An argument outside the values the op accepts, such as an unknown mode name."""


class DTypeError(TypeError, RuntimeError):
    """A dtype the op cannot take (a float tensor shifted left, an int tensor in a float-only op)."""


class UnknownDTypeError(TypeError, AttributeError):
    """A dtype name that does not exist (tinygrad looks names up as attributes of `dtypes`)."""


class IndexTypeError(IndexError, TypeError):
    """An index of a kind indexing does not take: float or bool tensors and lists (tinygrad raises IndexError)."""


class ModeError(TypeError, ValueError):
    """A mode or reduce argument outside the allowed names where tinygrad raises TypeError (scatter's reduce)."""


class UnknownModeError(ValueError, NotImplementedError):
    """A mode name no op implements (pad's mode: PyTorch raises NotImplementedError)."""

"""glassgrad: tinygrad's architecture in clear, typed Python.

    from glassgrad import Tensor
    x = Tensor([[1.0, 2.0], [3.0, 4.0]])
    print((x @ x.T).relu().sum(axis=1).numpy())

See docs/ARCHITECTURE.md for the walk from `a + b` to the generated kernel.
"""
from glassgrad.device import Device
from glassgrad.dtype import DType, dtypes
from glassgrad.engine.jit import TinyJit
from glassgrad.engine.realize import GlobalCounters
from glassgrad.function import function
from glassgrad.helpers import Context, fetch, getenv
from glassgrad.kernels import kernels
from glassgrad.tensor import Tensor, no_grad
from glassgrad.uop.sint import Variable

__all__ = ["Tensor", "dtypes", "DType", "Device", "GlobalCounters", "Context", "getenv", "fetch", "no_grad",
           "kernels", "TinyJit", "Variable", "function"]

"""tinygrad's small conveniences that its programs import: `function`, `helpers.colored`, `helpers.trange`,
`helpers.getenv`, `partition`/`flatten`/`dedup`/`round_up`/`get_child`/`Timing`, and `Tensor.is_param` (tinygrad's
name for "an optimizer trains this", which gradaccum_mnist.py partitions parameters by)."""
from __future__ import annotations

import numpy as np
import pytest

from glassgrad import Tensor, function, nn
from glassgrad.helpers import Timing, colored, dedup, flatten, get_child, getenv, partition, round_up, trange
from glassgrad.nn.state import get_parameters


def test_function_decorates_functions_and_methods() -> None:
    @function
    def double(x: Tensor) -> Tensor:
        return x * 2

    class Model:
        @function(precompile=True)
        def __call__(self, x: Tensor) -> Tensor:
            return x + 1

    assert double(Tensor([1.0, 2.0])).tolist() == [2.0, 4.0]
    assert Model()(Tensor([1.0])).tolist() == [2.0]
    with pytest.raises(TypeError, match="unexpected keyword"):
        function(speed=3)
    with pytest.raises(TypeError, match="bool"):
        function(precompile="yes")


def test_function_refuses_a_custom_gradient_it_would_ignore() -> None:
    """tinygrad's test/unit/test_function.py passes `grad_fxn=`: it was accepted and ignored, so a custom gradient
    (a straight-through estimator's: d round(x)/dx = 1) silently became the function's own (0 here)."""
    def straight_through(grad, call):  # type: ignore[no-untyped-def]
        return (grad,)

    with pytest.raises(NotImplementedError, match="grad_fxn"):
        function(grad_fxn=straight_through)(lambda x: x.round())
    assert function(grad_fxn=None)(lambda x: x * 2)(Tensor([1.0])).tolist() == [2.0]


def test_colored_trange_getenv() -> None:
    assert colored("ok", "green") == "\x1b[32mok\x1b[0m"
    assert colored("ok", "bright_red", background=True) == "\x1b[101mok\x1b[0m"
    assert colored("ok", None) == "ok"
    with pytest.raises(ValueError, match="unknown colour"):
        colored("x", "mauve")
    bar = trange(3)
    assert list(bar) == [0, 1, 2]
    bar.set_description("done")
    assert getenv("GLASSGRAD_SURELY_UNSET_FLAG", 7) == 7


def test_list_helpers_and_get_child(capsys: pytest.CaptureFixture[str]) -> None:
    assert partition([1, 2, 3, 4, 5], lambda v: v % 2 == 1) == ([1, 3, 5], [2, 4])
    assert flatten([[1, 2], [], [3]]) == [1, 2, 3]
    assert dedup([3, 1, 3, 2, 1]) == [3, 1, 2]
    assert [round_up(n, 4) for n in (0, 1, 4, 5)] == [0, 4, 4, 8]
    model = {"layers": [nn.Linear(2, 3), nn.Linear(3, 1)]}
    assert get_child(model, "layers.1.weight") is model["layers"][1].weight
    with pytest.raises(AttributeError):
        get_child(model, "layers.0.nothing")
    with Timing("block: ", on_exit=lambda ns: f" ({ns >= 0})"):
        pass
    out = capsys.readouterr().out
    assert out.startswith("block: ") and out.rstrip().endswith("ms (True)")


def test_is_param_partitions_params_from_buffers() -> None:
    """BatchNorm's running statistics are buffers (is_param False), weights are params; `is_param_(False)` makes a
    weight a buffer the optimizer leaves alone, `is_param_(True)` a trained param again."""
    bn, lin = nn.BatchNorm(2), nn.Linear(2, 2)
    params, buffers = partition(get_parameters([bn, lin]), lambda t: t.is_param)
    assert {id(t) for t in buffers} == {id(bn.running_mean), id(bn.running_var), id(bn.num_batches_tracked)}
    assert len(params) == 4
    frozen = lin.weight.is_param_(False)
    assert frozen is lin.weight and not frozen.is_param
    assert lin.bias is not None
    before, bias_before = lin.weight.numpy(), lin.bias.numpy()
    opt = nn.optim.SGD(get_parameters(lin), lr=0.5)
    with Tensor.train():
        opt.zero_grad()
        lin(Tensor([[1.0, 2.0]])).sum().backward()
        opt.step()
    assert (lin.weight.numpy() == before).all()
    np.testing.assert_allclose(lin.bias.numpy(), bias_before - 0.5, rtol=1e-6)  # the bias is still trained
    lin.weight.is_param = True
    assert lin.weight.is_param and lin.weight in nn.optim.SGD(get_parameters(lin)).params

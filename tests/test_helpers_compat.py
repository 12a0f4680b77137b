"""tinygrad's small conveniences that its programs import: `function`, `helpers.colored`, `helpers.trange`,
`helpers.getenv`."""
from __future__ import annotations

import pytest

from glassgrad import Tensor, function
from glassgrad.helpers import colored, getenv, trange


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

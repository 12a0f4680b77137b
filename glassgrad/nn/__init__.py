"""Neural-network building blocks on top of `Tensor`: layers, optimisers, model state and datasets.

In: nothing at import time. Out: the submodules `glassgrad.nn.state` (state dicts, safetensors files) and
`glassgrad.nn.datasets` (MNIST), imported by name.
"""

"""Training for 2,000 steps keeps a constant graph size and constant memory.

In: `--steps` (default 2000), `--device`. Out: a table of live UOp nodes, live buffer bytes and process RSS every
250 steps of an Adam-trained MLP (with BatchNorm, so running statistics are updated in place too), and a final
line comparing the last row with the first. Exit status 1 if anything grew by more than 5%.

    python bench/flat_memory.py
"""
from __future__ import annotations

import argparse
import gc
import os
import sys

import numpy as np

from glassgrad import Device, Tensor, nn, no_grad
from glassgrad.device import Buffer
from glassgrad.nn import optim, state
from glassgrad.uop.ops import UOp


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def live() -> tuple[int, int]:
    gc.collect()
    objects = gc.get_objects()
    nodes = sum(1 for o in objects if type(o) is UOp)
    buffers = sum(o.nbytes for o in objects if type(o) is Buffer and o.is_allocated)
    return nodes, buffers


class MLP:
    def __init__(self) -> None:
        self.layers = [nn.Linear(64, 128), nn.BatchNorm(128), Tensor.relu, nn.Linear(128, 10)]

    def __call__(self, x: Tensor) -> Tensor:
        return x.sequential(self.layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--device", default=Device.DEFAULT)
    args = parser.parse_args()
    Device.DEFAULT = Device.canonicalize(args.device)
    rng = np.random.default_rng(0)
    model = MLP()
    opt = optim.Adam(state.get_parameters(model), lr=1e-3)
    rows = []
    print(f"{'step':>6} {'live UOps':>10} {'live buffer MB':>15} {'RSS MB':>8} {'loss':>8}")
    for step in range(1, args.steps + 1):
        x = Tensor(rng.standard_normal((32, 64), dtype=np.float32))
        y = Tensor(rng.integers(0, 10, 32).astype(np.int32))
        with Tensor.train():
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y).backward()
            with no_grad():
                Tensor.realize_all(loss, *opt.schedule_step())
        if step == 250 or step % 250 == 0:
            nodes, buffers = live()
            rows.append((step, nodes, buffers, rss_bytes()))
            print(f"{step:6d} {nodes:10d} {buffers / 1e6:15.3f} {rows[-1][3] / 1e6:8.1f} {loss.item():8.4f}")
    first, last = rows[0], rows[-1]
    growth = [last[i] / max(first[i], 1) - 1 for i in (1, 2, 3)]
    print(f"from step {first[0]} to {last[0]}: UOps {growth[0]:+.1%}, buffers {growth[1]:+.1%}, RSS {growth[2]:+.1%}")
    sys.exit(1 if max(growth) > 0.05 else 0)


if __name__ == "__main__":
    main()

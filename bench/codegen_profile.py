"""CPU cost of generating CUDA kernels (scheduling excluded): render a fixed set of kernels for CUDA, no GPU needed.

In: `--set small` (default: a bf16 tensor-core linear layer of GPT-2's MLP under autocast with its backward --
forward matmul, input and weight gradients --, attention's q @ k^T with head 64, flash attention's chained kernels
with their backward, and a few reductions: softmax, layernorm, sums) or `--set gpt` (bench/gpt.py's train_bf16
step: GPT-2 124M, batch 8 x 1024, forward under autocast, backward and AdamW, every distinct kernel).
`--save DIR` writes each kernel's CUDA source to DIR/NNN_NAME.cu; `--check DIR` compares the sources with such a
folder byte by byte (exit status 1 on any difference). `--profile N` prints cProfile's top N functions by
cumulative time. Out: the CPU seconds (process time) scheduling took, per kernel those `get_program` took (the 20
slowest), and their total. Compare sources of runs with one PYTHONHASHSEED, and check which `glassgrad` is imported
(`PYTHONPATH=.` for this checkout: the script's folder, not the working directory, is on sys.path).

    PYTHONPATH=. PYTHONHASHSEED=0 python bench/codegen_profile.py --save /tmp/base
    PYTHONPATH=. PYTHONHASHSEED=0 python bench/codegen_profile.py --check /tmp/base --profile 30
    PYTHONPATH=. PYTHONHASHSEED=0 python bench/codegen_profile.py --set gpt --check /tmp/base_gpt
"""
from __future__ import annotations

import argparse
import cProfile
import pathlib
import pstats
import sys
import time

from glassgrad import Tensor, amp, dtypes
from glassgrad.codegen import ProgramSpec, get_program
from glassgrad.kernels import _retarget
from glassgrad.renderer.cuda import CUDARenderer
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops, UOp

BF16 = dtypes.bfloat16


def _empty(*shape: int, dtype=dtypes.float32, grad: bool = False) -> Tensor:  # type: ignore[no-untyped-def]
    return Tensor.empty(*shape, dtype=dtype, device="CUDA", requires_grad=grad)


def linear_set() -> list[Tensor]:
    """GPT-2's MLP up-projection under bf16 autocast, (8192 x 768) @ (768 x 3072), and its gradients."""
    x, w, bias = _empty(8192, 768, grad=True), _empty(768, 3072, grad=True), _empty(3072, grad=True)
    with amp.autocast(BF16):
        out = amp.linear(x, w, bias)
    (out.float() * _empty(8192, 3072)).sum().backward()
    return [out, x.grad, w.grad, bias.grad]  # type: ignore[list-item]


def attention_set() -> list[Tensor]:
    """Scores q @ k^T (head 64, bf16, no flash), and flash attention's chained kernels with their backward."""
    q, k = _empty(8, 12, 1024, 64, dtype=BF16), _empty(8, 12, 1024, 64, dtype=BF16)
    scores = q @ k.transpose(-1, -2)
    fq, fk, fv = (_empty(2, 3, 256, 64, dtype=BF16, grad=True) for _ in range(3))
    with amp.autocast(BF16):
        out = amp.attention(fq, fk, fv, is_causal=True)
    (out.float() * out.float()).sum().backward()
    return [scores, out, fq.grad, fk.grad, fv.grad]  # type: ignore[list-item]


def reduction_set() -> list[Tensor]:
    """Softmax and layernorm rows of GPT-2 sizes, a column sum and a full sum."""
    x = _empty(8192, 768)
    return [_empty(96, 1024, 1024).softmax(-1), x.layernorm(), x.sum(0), x.sum()]


def gpt_set() -> list[Tensor]:
    """bench/gpt.py's train_bf16 step (built on the CPU, parameters realized there; not run): loss, gradients and
    AdamW's updates."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import numpy as np
    from gpt import FULL

    from glassgrad.models.gpt2 import GPT2
    from glassgrad.nn import optim
    from glassgrad.nn.state import get_parameters
    config, batch, context = FULL.mixed, FULL.mixed_batch, FULL.mixed_context
    Tensor.manual_seed(0)
    model = GPT2(config)
    Tensor.realize_all(*get_parameters(model))  # on the CPU: the step reads realized parameters
    opt = optim.AdamW(get_parameters(model), lr=1e-4)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (batch, context + 1)).astype(np.int32)
    x, y = Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:])
    with Tensor.train():
        opt.zero_grad()
        with amp.autocast(BF16):
            loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        return [loss, *opt.schedule_step()]


def kernel_asts(tensors: list[Tensor]) -> list[UOp]:
    """The distinct kernel ASTs realizing `tensors` on CUDA, in schedule order (copies left out)."""
    uops = list(_retarget(UOp(Ops.SINK, dtypes.void, tuple(t.uop for t in tensors)), "CUDA").src)
    schedule, _ = create_schedule(uops)
    out: dict[UOp, None] = {}
    for item in schedule:
        if item.ast.op not in (Ops.COPY, Ops.ALLREDUCE):
            out.setdefault(item.ast)
    return list(out)


def render_all(asts: list[UOp], profiler: cProfile.Profile | None) -> list[tuple[ProgramSpec, float]]:
    """Each AST rendered for CUDA (sm_90), with the process time `get_program` took."""
    renderer = CUDARenderer("sm_90")
    out = []
    for ast in asts:
        start = time.process_time()
        if profiler is not None:
            profiler.enable()
        spec = get_program(ast, renderer)
        if profiler is not None:
            profiler.disable()
        out.append((spec, time.process_time() - start))
    return out


def compare(specs: list[ProgramSpec], folder: pathlib.Path) -> int:
    """How many sources differ from (or are missing in) `folder`; each difference is printed."""
    bad = 0
    names = sorted(folder.glob("*.cu"))
    if len(names) != len(specs):
        print(f"{len(specs)} kernels, {len(names)} in {folder}")
        bad += 1
    for i, spec in enumerate(specs):
        path = folder / f"{i:03d}_{spec.name}.cu"
        if not path.exists() or path.read_text() != spec.source:
            print("DIFFERENT:", path)
            bad += 1
    return bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("small", "gpt"), default="small")
    parser.add_argument("--save", default="", help="write the sources to this folder")
    parser.add_argument("--check", default="", help="compare the sources with this folder")
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N by cumulative time")
    args = parser.parse_args()
    tensors = gpt_set() if args.set == "gpt" else [*linear_set(), *attention_set(), *reduction_set()]
    start = time.process_time()
    asts = kernel_asts(tensors)
    print(f"scheduling: {time.process_time() - start:.2f} s CPU")
    profiler = cProfile.Profile() if args.profile else None
    rendered = render_all(asts, profiler)
    for spec, seconds in sorted(rendered, key=lambda r: -r[1])[:20]:
        print(f"{seconds:8.3f} s  {spec.name:<40} {' '.join(map(repr, spec.opts))}")
    print(f"{len(rendered)} kernels, {sum(s for _, s in rendered):.2f} s CPU in get_program")
    specs = [spec for spec, _ in rendered]
    if args.save:
        folder = pathlib.Path(args.save)
        folder.mkdir(parents=True, exist_ok=True)
        for i, spec in enumerate(specs):
            (folder / f"{i:03d}_{spec.name}.cu").write_text(spec.source)
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.profile)
    if args.check:
        bad = compare(specs, pathlib.Path(args.check))
        print("sources identical" if not bad else f"{bad} sources differ")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

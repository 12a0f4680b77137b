"""Instructions per call of a `bench/overhead.py` workload, counted by valgrind's callgrind over the timed loop alone.

Instruction counts do not depend on the machine's load, unlike times. The count covers only the calls (not start-up,
imports or warm-up: callgrind's statistics are zeroed before the loop and dumped after it, through its client
requests in a small C helper built here with the valgrind headers), only the main thread, with the garbage collector
off during the calls, `PYTHONHASHSEED=0` and `THREADS=1`. Needs valgrind (with its headers) and a C compiler. The
MLP step's kernels use instructions valgrind 3.19 does not know (AVX-512), so `mlp` may not run.

    python bench/overhead_instructions.py hit1 1000          # this tree
    python bench/overhead_instructions.py hit1 1000 --tree /path/to/other/checkout

The per-call count drifts with the number of calls at first (a periodic clean-up of the lazy-tensor list lands in
some windows), so compare trees with the same count of calls, and use a few hundred or more.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HELPER = """#include <valgrind/callgrind.h>
void zero(void) { CALLGRIND_ZERO_STATS; }
void dump(void) { CALLGRIND_DUMP_STATS_AT("measured"); }
"""


def measure(name: str, calls: int) -> None:
    """Runs inside valgrind: warm up, then the calls between the helper's zero and dump."""
    sys.modules["torch"] = None  # type: ignore[assignment]  # (PyTorch's columns are not measured here)
    sys.path.insert(0, str(Path(__file__).parent))
    import overhead
    helper = ctypes.CDLL(os.environ["GG_CALLGRIND_HELPER"])
    workloads = {"hit1": lambda: overhead.gg_hit("CPU", 1), "hit10": lambda: overhead.gg_hit("CPU", 10),
                 "chain": lambda: overhead.gg_chain("CPU"), "build": lambda: overhead.gg_build("CPU"),
                 "mlp": lambda: overhead.gg_mlp("CPU")}
    fn = workloads[name]()
    for _ in range(10):
        fn()
    gc.collect()
    gc.disable()
    helper.zero()
    for _ in range(calls):
        fn()
    helper.dump()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=["hit1", "hit10", "chain", "build", "mlp"])
    parser.add_argument("calls", type=int)
    parser.add_argument("--tree", default=str(Path(__file__).parent.parent), help="the checkout whose glassgrad runs")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        measure(args.workload, args.calls)
        return
    with tempfile.TemporaryDirectory() as tmp:
        source, helper = Path(tmp) / "helper.c", Path(tmp) / "helper.so"
        source.write_text(HELPER)
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(helper), str(source)], check=True)
        env = {**os.environ, "PYTHONPATH": args.tree, "PYTHONHASHSEED": "0", "THREADS": "1",
               "GG_CALLGRIND_HELPER": str(helper)}
        out = Path(tmp) / "cg.out"
        subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                        sys.executable, __file__, args.workload, str(args.calls), "--inside"],
                       env=env, cwd=tmp, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        dumps = [p for p in Path(tmp).glob("cg.out.*-01") if "measured" in p.read_text(errors="replace")[:2000]]
        if not dumps:
            raise RuntimeError("callgrind wrote no dump of the measured calls")
        totals = next(line for line in dumps[0].read_text().splitlines() if line.startswith("totals:"))
        print(f"{args.workload}: {int(totals.split()[1]) // args.calls} instructions per call ({args.calls} calls, "
              f"{args.tree})")


if __name__ == "__main__":
    main()

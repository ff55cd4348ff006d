"""One process of bench/gpu_bench.py: for each suite kernel at this GPU's own
target, the time from asking Triton for it to having it loaded and launchable
(triton.compile, then loading the cubin and the launcher module). Prints JSON:
kernel name -> milliseconds."""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

import triton  # noqa: E402
from triton.compiler.compiler import ASTSource  # noqa: E402

import kernel_suite  # noqa: E402


def main():
    from triton.runtime.cache import triton_key

    triton_key()  # every Triton process pays this first, stock or not
    times = {}
    for case in kernel_suite.SUITE:
        start = time.perf_counter()
        kernel = triton.compile(ASTSource(case.fn, case.signature, case.constexprs), options=case.options)
        kernel._init_handles()
        times[case.name] = (time.perf_counter() - start) * 1e3
    print(json.dumps(times))


if __name__ == "__main__":
    main()

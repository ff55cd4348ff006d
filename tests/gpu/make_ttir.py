"""Writes the frontend TTIR of the suite's fp32 vector-add and 32x32x32 matmul
for a target, as Triton emits it, for examples/gpu (the C++ SDK example).

usage: make_ttir.py ARCH OUTDIR"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from triton.backends.compiler import GPUTarget  # noqa: E402

import kernel_suite  # noqa: E402
import triton_frontend  # noqa: E402

cases = {case.name: case for case in kernel_suite.SUITE}
out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
for name, file in (("add_fp32", "add.ttir"), ("matmul_fp32_32x32x32_s1", "matmul.ttir")):
    (out / file).write_text(triton_frontend.run_frontend(cases[name], GPUTarget("cuda", int(sys.argv[1]), 32)).ttir)

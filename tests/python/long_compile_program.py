"""A program whose one kernel takes seconds to compile (a long unrolled loop of
sin), for sm90 with no GPU needed: a compile that is still running when a test
stops kilnd. Prints one JSON object: the kernel's cubin digest.

usage: long_compile_program.py STEPS"""

import hashlib
import json
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def long_unrolled_sin(x_ptr, out_ptr, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets)
    acc = x
    for step in tl.static_range(STEPS):
        acc = tl.sin(acc * (step + 1) + x)
    tl.store(out_ptr + offsets, acc)


source = ASTSource(long_unrolled_sin,
                   signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "BLOCK": "constexpr", "STEPS": "constexpr"},
                   constexprs={"BLOCK": 128, "STEPS": int(sys.argv[1])})
kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32))
print(json.dumps({"cubin_sha256": hashlib.sha256(kernel.asm["cubin"]).hexdigest()}))

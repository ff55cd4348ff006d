"""A suite of real Triton kernels and the ways they are compiled, for tests and
benchmarks of the compile pipeline. Each case is what @triton.jit would hand to
triton.compile: an ASTSource (kernel, signature, constexprs) plus options."""

from dataclasses import dataclass, field

import triton
import triton.language as tl

try:
    from triton.language.target_info import cuda_capability_geq
except ImportError:  # Triton 3.4: no frontend function asks the machine's GPU
    cuda_capability_geq = None


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = x * tl.sigmoid(1.702 * x)
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sum_rows_kernel(x_ptr, out_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + offsets, mask=offsets < cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(x.to(tl.float32), axis=0))


@triton.jit
def max_rows_kernel(x_ptr, out_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + offsets, mask=offsets < cols, other=-float("inf"))
    tl.store(out_ptr + row, tl.max(x, axis=0))


@triton.jit
def softmax_kernel(x_ptr, out_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * stride + offsets, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(out_ptr + row * stride + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * stride + offsets, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / cols
    centered = tl.where(mask, x - mean, 0.0)
    rstd = 1 / tl.sqrt(tl.sum(centered * centered, axis=0) / cols + eps)
    w = tl.load(w_ptr + offsets, mask=mask)
    b = tl.load(b_ptr + offsets, mask=mask)
    y = centered * rstd * w + b
    tl.store(out_ptr + row * stride + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn,
             acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, seq_len, scale, stride_s,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    rm = start_m + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + rm[:, None] * stride_s + rd[None, :], mask=rm[:, None] < seq_len, other=0.0)
    m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        rn = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + rn[:, None] * stride_s + rd[None, :], mask=rn[:, None] < seq_len, other=0.0)
        v = tl.load(v_ptr + rn[:, None] * stride_s + rd[None, :], mask=rn[:, None] < seq_len, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(rn[None, :] < seq_len, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(out_ptr + rm[:, None] * stride_s + rd[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=rm[:, None] < seq_len)


@triton.jit
def huge_shared_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    """Needs more shared memory than any GPU has, so ptxas/launch refuse it."""
    rows = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + rows[:, None] * BLOCK + rows[None, :])
    tl.store(out_ptr + rows[:, None] * BLOCK + rows[None, :], tl.trans(x))


@triton.jit
def frontend_error_kernel(x_ptr, BLOCK: tl.constexpr):
    """Fails in Triton's frontend (a CompilationError): the name is undefined."""
    tl.store(x_ptr + tl.arange(0, BLOCK), undefined_name)  # noqa: F821


@triton.jit
def where_warning_kernel(out_ptr, BLOCK: tl.constexpr):
    """Compiles, but the frontend warns (tl.where with a non-boolean condition)
    and prints (tl.static_print)."""
    tl.static_print("compiling where_warning_kernel")
    a = tl.full((BLOCK, ), 0, tl.uint32)
    tl.store(out_ptr + tl.arange(0, BLOCK), tl.where(a, 1.0, 2.0))


@triton.jit
def rmsnorm_gelu_kernel(x, w, y, N, eps, BLOCK: tl.constexpr):
    """Its second loop carries no value: its frontend TTIR prints no scf.yield
    there (a kernel that a bundle's untrusted import once failed to parse)."""
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for off in range(0, N, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        v = tl.load(x + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc += v * v
    r = 1.0 / tl.sqrt(tl.sum(acc, 0) / N + eps)
    for off in range(0, N, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        m = cols < N
        v = tl.load(x + row * N + cols, mask=m, other=0.0).to(tl.float32) * r * tl.load(w + cols, mask=m).to(tl.float32)
        tl.store(y + row * N + cols, (0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))).to(tl.float16), mask=m)


if cuda_capability_geq is not None:
    @triton.jit
    def device_dependent_kernel(out_ptr, BLOCK: tl.constexpr):
        """Triton's frontend asks the GPU of the machine it runs on (whatever the
        compile's target) whether it is Hopper or newer: its TTIR depends on that."""
        if cuda_capability_geq(9, 0):
            tl.store(out_ptr + tl.arange(0, BLOCK), tl.full((BLOCK, ), 2.0, tl.float32))
        else:
            tl.store(out_ptr + tl.arange(0, BLOCK), tl.full((BLOCK, ), 1.0, tl.float32))


@dataclass
class Case:
    name: str
    fn: object
    signature: dict
    constexprs: dict
    options: dict = field(default_factory=dict)


def _elementwise(name, fn, dtype, block, **options):
    return Case(name, fn, {"x_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "n": "i32",
                           "BLOCK": "constexpr"}, {"BLOCK": block}, options)


def _rows(name, fn, dtype, block, **options):
    return Case(name, fn, {"x_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "cols": "i32", "stride": "i32",
                           "BLOCK": "constexpr"}, {"BLOCK": block}, options)


def _matmul(name, dtype, bm, bn, bk, **options):
    sig = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": f"*{dtype}"}
    sig.update({k: "i32" for k in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn",
                                   "stride_cm", "stride_cn")})
    sig.update({"BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"})
    return Case(name, matmul_kernel, sig, {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, options)


def _attention(name, dtype, bm, bn, head_dim, **options):
    sig = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "out_ptr": f"*{dtype}",
           "seq_len": "i32", "scale": "fp32", "stride_s": "i32",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "HEAD_DIM": "constexpr"}
    return Case(name, attention_kernel, sig, {"BLOCK_M": bm, "BLOCK_N": bn, "HEAD_DIM": head_dim}, options)


SUITE = [
    _elementwise("add_fp32", add_kernel, "fp32", 1024),
    _elementwise("add_fp16_w8", add_kernel, "fp16", 4096, num_warps=8),
    _elementwise("add_bf16", add_kernel, "bf16", 512),
    Case("gelu_fp16", gelu_kernel, {"x_ptr": "*fp16", "out_ptr": "*fp16", "n": "i32", "BLOCK": "constexpr"},
         {"BLOCK": 1024}),
    _rows("sum_rows_fp32", sum_rows_kernel, "fp32", 1024),
    _rows("max_rows_bf16", max_rows_kernel, "bf16", 2048, num_warps=8),
    _rows("softmax_fp32", softmax_kernel, "fp32", 1024),
    _rows("softmax_fp16_w8", softmax_kernel, "fp16", 4096, num_warps=8),
    Case("layernorm_fp16", layernorm_kernel,
         {"x_ptr": "*fp16", "w_ptr": "*fp16", "b_ptr": "*fp16", "out_ptr": "*fp16", "cols": "i32",
          "stride": "i32", "eps": "fp32", "BLOCK": "constexpr"}, {"BLOCK": 1024}),
    _matmul("matmul_fp16_64x64x32_s2", "fp16", 64, 64, 32, num_stages=2),
    _matmul("matmul_fp16_128x128x32_s3", "fp16", 128, 128, 32, num_stages=3, num_warps=8),
    _matmul("matmul_bf16_128x64x64_s4", "bf16", 128, 64, 64, num_stages=4),
    _matmul("matmul_fp32_32x32x32_s1", "fp32", 32, 32, 32, num_stages=1),
    _attention("attention_fp16_64", "fp16", 64, 64, 64),
    _attention("attention_bf16_128", "bf16", 128, 64, 64, num_warps=8, num_stages=2),
]

# A user's program for its one GPU: the suite and nine more of the same kinds
# (elementwise, reductions, softmax, layernorm, matmuls, attention), 24
# kernels compiled one after another for one target.
USER_PROGRAM = SUITE + [
    _elementwise("add_fp32_256", add_kernel, "fp32", 256),
    Case("gelu_bf16", gelu_kernel, {"x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32", "BLOCK": "constexpr"},
         {"BLOCK": 2048}, {"num_warps": 8}),
    _rows("sum_rows_fp16", sum_rows_kernel, "fp16", 512),
    _rows("softmax_bf16", softmax_kernel, "bf16", 2048),
    Case("layernorm_fp32", layernorm_kernel,
         {"x_ptr": "*fp32", "w_ptr": "*fp32", "b_ptr": "*fp32", "out_ptr": "*fp32", "cols": "i32",
          "stride": "i32", "eps": "fp32", "BLOCK": "constexpr"}, {"BLOCK": 2048}, {"num_warps": 8}),
    _matmul("matmul_fp16_64x128x64_s3", "fp16", 64, 128, 64, num_stages=3),
    _matmul("matmul_bf16_32x64x32_s2", "bf16", 32, 64, 32, num_stages=2),
    _matmul("matmul_fp16_128x64x32_s4_w8", "fp16", 128, 64, 32, num_stages=4, num_warps=8),
    _attention("attention_fp16_32", "fp16", 64, 32, 32),
]

# Kernels outside the suite, for the tests of what kilnd makes of a kernel's
# recorded TTIR (bundle imports, prewarm).
LOOPS_CARRYING_NOTHING = [
    Case(f"rmsnorm_gelu_{block}", rmsnorm_gelu_kernel,
         {"x": "*fp16", "w": "*fp16", "y": "*fp16", "N": "i32", "eps": "fp32", "BLOCK": "constexpr"},
         {"BLOCK": block})
    for block in (1024, 4096)
]

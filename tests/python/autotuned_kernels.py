"""Autotuned kernels for the compile-only tests of autotuning (client_probe.py
autotune-warmup, bench/autotune_cpu_bench.py), and what stands in for a GPU
there: none is here, and the JIT asks its driver only which device it is on
and what it targets, and of a tensor argument only its dtype and address."""

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget


class CompileOnlyDriver:
    """Stands in for the CUDA driver of an sm90, for compiles only."""

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


class _Float16:
    def __str__(self):
        return "torch.float16"  # how the JIT names a tensor's dtype


class StandInTensor:
    """An fp16 tensor argument, 16-byte aligned."""
    dtype = _Float16()

    def data_ptr(self):
        return 1 << 20


def _matmul(a, b, c, size, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            MOST_M: tl.constexpr):
    tl.static_assert(BLOCK_M <= MOST_M, "BLOCK_M above MOST_M is not supported")
    rows, cols, inner = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(size, BLOCK_K)):
        x = tl.load(a + rows[:, None] * size + (k * BLOCK_K + inner)[None, :])
        y = tl.load(b + (k * BLOCK_K + inner)[:, None] * size + cols[None, :])
        acc += tl.dot(x, y)
    tl.store(c + rows[:, None] * size + cols[None, :], acc.to(tl.float16))


def autotuned_matmul(sizes, most_m=128, do_bench=None):
    """An fp16 matmul autotuned over (BLOCK_M, BLOCK_N) `sizes`; a config whose
    BLOCK_M passes `most_m` fails its static_assert when it compiles."""
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": 32, "MOST_M": most_m}, num_warps=4, num_stages=3)
               for m, n in sizes]
    return triton.autotune(configs=configs, key=["size"], do_bench=do_bench)(triton.jit(_matmul))


class StandInBenchmark:
    """Stands in for the GPU's timing of a config (the autotuner's do_bench):
    milliseconds by (BLOCK_M, BLOCK_N), and the configs in the order they were
    benchmarked. It runs no kernel: none can run here."""

    def __init__(self, milliseconds):
        self.milliseconds, self.benchmarked = milliseconds, []

    def __call__(self, kernel_call, quantiles):
        # The autotuner's kernel_call closes over the config it runs.
        cells = dict(zip(kernel_call.__code__.co_freevars, (cell.cell_contents for cell in kernel_call.__closure__)))
        config = cells["config"]
        self.benchmarked.append(str(config))
        timing = self.milliseconds[(config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"])]
        return [timing] * len(quantiles)


MATMUL = autotuned_matmul(((32, 32), (32, 64), (64, 32), (64, 64)))
# The second config fails: warmup raises, as the autotuner's benchmark would skip it.
FAILING_MATMUL = autotuned_matmul(((32, 32), (128, 32), (64, 32), (64, 64)), most_m=64)

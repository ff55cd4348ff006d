"""The autotuned kernels of bench/autotune_bench.py, in a process of their own:
an fp16 GEMM with 16 configs and a row normalization with 8, each run once on
the GPU (autotuning every config, as a first call does). Prints one JSON
object: seconds from the first call to both results on the GPU, the best
configs, whether the results match torch's, and how much of the time the
benchmarks themselves took.

  python autotune_program.py [--precompile-threads N] [--timeline]

--precompile-threads N first compiles every config of both kernels in N
threads of this process (kernel.warmup per config), as Triton's open pull
requests for parallel autotuning do, then runs them.

--timeline adds when each config's compile and benchmark began and ended
(seconds from the first call): where a cold run's time goes."""

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
import triton.language as tl

GEMM_CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
                for (m, n, k, w, s) in ((128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
                                        (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
                                        (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 2, 5),
                                        (32, 64, 32, 2, 5), (128, 128, 64, 4, 4), (128, 256, 32, 8, 4),
                                        (256, 64, 64, 8, 3), (64, 64, 64, 4, 3), (128, 64, 64, 4, 3),
                                        (64, 128, 64, 4, 3))]
NORM_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b in (1024, 2048, 4096, 8192) for w in (4, 8)]


@triton.autotune(configs=GEMM_CONFIGS, key=["M", "N", "K"])
@triton.jit
def gemm(a, b, c, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    blocks_n = tl.cdiv(N, BLOCK_N)
    rows = (pid // blocks_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % blocks_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        offsets = k * BLOCK_K + inner
        x = tl.load(a + rows[:, None] * stride_am + offsets[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (offsets[None, :] < K), other=0.0)
        y = tl.load(b + offsets[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(offsets[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(x, y)
    tl.store(c + rows[:, None] * stride_cm + cols[None, :] * stride_cn, acc.to(tl.float16),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.autotune(configs=NORM_CONFIGS, key=["N"])
@triton.jit
def normalize(x, y, weight, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK, ), dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / N
    acc = tl.zeros((BLOCK, ), dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        value = tl.load(x + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc += tl.where(cols < N, (value - mean) * (value - mean), 0.0)
    rstd = 1 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        value = tl.load(x + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
        scale = tl.load(weight + cols, mask=cols < N, other=0.0).to(tl.float32)
        tl.store(y + row * N + cols, ((value - mean) * rstd * scale).to(tl.float16), mask=cols < N)


def _fastest(tuner, count=3):
    timings = sorted((timing[0] if isinstance(timing, (list, tuple)) else timing, str(config.kwargs))
                     for config, timing in tuner.configs_timings.items())
    return [f"{ms:.4f} {config}" for ms, config in timings[:count]]


def _record_compiles(tuner, timeline):
    """Notes each compile of the tuner's kernel (the JIT's run with
    warmup=True, as Kiln's threads and precompiles call it) and each first
    run of a config not yet compiled, which compiles in the benchmark."""
    stock_run, seen = tuner.fn.run, set()

    def run(*args, **kwargs):
        config = ",".join(f"{kwargs.get(name)}" for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK") if name in kwargs)
        config += f"/w{kwargs.get('num_warps')}s{kwargs.get('num_stages')}"
        first = config not in seen
        seen.add(config)
        begun = time.perf_counter()
        try:
            return stock_run(*args, **kwargs)
        finally:
            if kwargs.get("warmup") or first:
                what = "compile" if kwargs.get("warmup") else "first run"
                timeline.append((f"{what} {tuner.fn.__name__} {config}", begun, time.perf_counter()))

    tuner.fn.run = run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--precompile-threads", type=int, default=0)
    parser.add_argument("--timeline", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    size = 2048
    a = torch.randn((size, size), device="cuda", dtype=torch.float16)
    b = torch.randn((size, size), device="cuda", dtype=torch.float16)
    c = torch.empty((size, size), device="cuda", dtype=torch.float16)
    x = torch.randn((4096, 8192), device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    weight = torch.randn((8192, ), device="cuda", dtype=torch.float16)
    gemm_args = (a, b, c, size, size, size, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                 c.stride(1))
    norm_args = (x, y, weight, x.shape[1], 1e-5)
    torch.cuda.synchronize()
    # The benchmarks' own time (the autotuner's do_bench), apart from waiting for compiles.
    benchmarking = []
    benchmarker = triton.runtime.driver.active.get_benchmarker()

    timeline = []  # (what, began, ended): perf_counter seconds

    def timed_benchmark(kernel_call, quantiles):
        begun = time.perf_counter()
        try:
            return benchmarker(kernel_call, quantiles=quantiles)
        finally:
            benchmarking.append(time.perf_counter() - begun)
            timeline.append(("benchmark", begun, time.perf_counter()))

    gemm._do_bench = normalize._do_bench = timed_benchmark
    if args.timeline:
        for tuner in (gemm, normalize):
            _record_compiles(tuner, timeline)

    started = time.perf_counter()
    if args.precompile_threads:
        with ThreadPoolExecutor(args.precompile_threads) as pool:
            compiles = [pool.submit(gemm.fn.warmup, *gemm_args, grid=(1, ), **config.all_kwargs())
                        for config in GEMM_CONFIGS]
            compiles += [pool.submit(normalize.fn.warmup, *norm_args, grid=(1, ), **config.all_kwargs())
                         for config in NORM_CONFIGS]
            for compiled in compiles:
                compiled.result()
    gemm[lambda meta: (triton.cdiv(size, meta["BLOCK_M"]) * triton.cdiv(size, meta["BLOCK_N"]), )](*gemm_args)
    normalize[(x.shape[0], )](*norm_args)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    # When each began and ended, in seconds from the first call, in the order they began (ties by name).
    events = sorted(((what, round(begun - started, 3), round(ended - started, 3)) for what, begun, ended in timeline),
                    key=lambda event: (event[1], event[0]))

    reference = torch.nn.functional.layer_norm(x.float(), (x.shape[1], ), eps=1e-5).half() * weight
    print(json.dumps({
        "seconds": seconds,
        "benchmark_seconds": sum(benchmarking),
        **({"timeline": events} if args.timeline else {}),
        "gemm_best": str(gemm.best_config),
        "normalize_best": str(normalize.best_config),
        # The three fastest configs of each, in ms: how near the choice was.
        "gemm_top": _fastest(gemm), "normalize_top": _fastest(normalize),
        "correct": bool(torch.allclose(c.float(), (a.float() @ b.float()), atol=0.5, rtol=1e-2))
        and bool(torch.allclose(y.float(), reference.float(), atol=0.1, rtol=1e-2)),
    }))


if __name__ == "__main__":
    main()

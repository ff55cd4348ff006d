"""One process of test_inductor_claims.py: torch.compile (inductor, on the CPU)
a small model, once for inference and once with a backward, with its own empty
local caches, and print one JSON line: outputs equal to eager, inductor's and
AOTAutograd's cache counters, and seconds spent.

usage: inductor_graph_program.py START_FILE [--raise] [--hold-claim SECONDS] [--ask-pool]

START_FILE: the process waits until it exists, so that several start compiling
together. --raise: every graph's compile raises (as a lowering error would) in
every process. --hold-claim: the process sleeps that long inside its first graph
compile, after its cache miss (a claimant a test kills). --ask-pool: compiles
through dynamo's registered inductor backend, which asks inductor to start its
pool of compile workers early (as compile_fx does for a graph with CUDA
inputs), reports whether that pool had started when inductor began to lower
the first graph, and at the end asks inductor whether to compile kernels in
that pool, as it does for each Triton kernel, and reports whether that started
the pool."""

import json
import os
import sys
import time

import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 256)
        self.down = torch.nn.Linear(256, 64)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def break_graph_compiles():
    """Makes inductor's compile of every graph raise, as a bug in its lowering would."""
    from torch._inductor import compile_fx

    def failing(*args, **kwargs):
        raise RuntimeError("kiln test: this graph's compile fails")

    compile_fx.fx_codegen_and_compile = failing


def hold_first_claim(seconds):
    """Sleeps in the first FX graph compile, after its lookup missed."""
    from torch._inductor import compile_fx

    original = compile_fx.fx_codegen_and_compile

    def slow(*args, **kwargs):
        print("holding", flush=True)
        time.sleep(seconds)
        return original(*args, **kwargs)

    compile_fx.fx_codegen_and_compile = slow


def note_pool_at_first_lowering(result):
    from torch._inductor import async_compile, compile_fx

    lower = compile_fx.fx_codegen_and_compile

    def noting(*args, **kwargs):
        result.setdefault("pool_up_when_lowering", bool(async_compile._pool_set))
        return lower(*args, **kwargs)

    compile_fx.fx_codegen_and_compile = noting


def main():
    start_file = sys.argv[1]
    while not os.path.exists(start_file):
        time.sleep(0.005)
    if "--raise" in sys.argv:
        break_graph_compiles()
    if "--hold-claim" in sys.argv:
        hold_first_claim(float(sys.argv[sys.argv.index("--hold-claim") + 1]))
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(8, 64)
    result = {}
    backend = "inductor"
    if "--ask-pool" in sys.argv:
        note_pool_at_first_lowering(result)
        backend = torch._dynamo.lookup_backend("inductor")
    started = time.perf_counter()
    try:
        with torch.no_grad():
            result["inference_equal"] = bool(torch.allclose(torch.compile(model, backend=backend)(x), model(x), atol=1e-5))
        compiled = torch.compile(model, backend=backend)
        x.requires_grad_(True)
        compiled(x).sum().backward()
        compiled_grad = x.grad.clone()
        x.grad = None
        model(x).sum().backward()
        result["training_equal"] = bool(torch.allclose(compiled_grad, x.grad, atol=1e-5))
    except Exception as error:  # the test compares it with stock's
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    result["seconds"] = round(time.perf_counter() - started, 3)
    from torch._dynamo.utils import counters

    result["inductor"] = {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
    result["aot_autograd"] = {k: v for k, v in counters["aot_autograd"].items() if "cache" in k}
    if "--ask-pool" in sys.argv:
        # What inductor asks before it loads or compiles a Triton kernel (a GPU
        # graph's, which this CPU model has none of): it starts the pool of
        # compile worker processes if it may use one.
        from torch._inductor import async_compile

        async_compile.AsyncCompile.use_process_pool()
        result["compile_pool_started"] = bool(async_compile._pool_set)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

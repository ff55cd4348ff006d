"""One process of inductor_warm.py: torch.compile a 2-block fp16 transformer
and an MLP, time the first call, compare with eager.

usage: inductor_program.py [--wider] [--start-file PATH] [--profile PREFIX]
prints one JSON line: per model, the first call's seconds and the part of them
Python's garbage collector ran (collector_s), and whether it matched eager.

--start-file: waits until PATH exists before compiling (several processes
started together: inductor_fanout.py).
--profile: profiles each model's first call, PREFIX.<model>.txt (where a warm
start spends its time: inductor_warm.py --profile)."""

import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from collector_pauses import CollectorPauses  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, width, heads=8):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.heads = heads

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, -1).unbind(2)
        attention = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, seq, width))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class Transformer(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.blocks = torch.nn.Sequential(Block(width), Block(width))
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(self.blocks(x))


class MLP(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width), torch.nn.LayerNorm(width))

    def forward(self, x):
        return self.net(x)


def count_benchmarks():
    """Counts inductor's autotuning benchmarks (each kernel's configs timed at its first run)."""
    from torch._inductor.runtime import triton_heuristics

    autotuner = triton_heuristics.CachingAutotuner
    benchmark = autotuner.benchmark_all_configs
    count = [0]

    def counted(self, *args, **kwargs):
        count[0] += 1
        return benchmark(self, *args, **kwargs)

    autotuner.benchmark_all_configs = counted
    return count


def write_profile(profile, path):
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(70)
    stats.sort_stats("tottime").print_stats(30)
    with open(path, "w") as out:
        out.write(text.getvalue())


def main():
    benchmarks = count_benchmarks()
    if "--start-file" in sys.argv:
        start_file = sys.argv[sys.argv.index("--start-file") + 1]
        while not os.path.exists(start_file):
            time.sleep(0.005)
    width = 768 if "--wider" in sys.argv else 512
    torch.manual_seed(0)
    result = {}
    collector = CollectorPauses().start()
    for name, model in (("transformer", Transformer(width)), ("mlp", MLP(width))):
        model = model.cuda().half().eval()
        x = torch.randn(4, 128, width, device="cuda", dtype=torch.half)
        with torch.no_grad():
            eager = model(x)
            compiled = torch.compile(model)
            torch.cuda.synchronize()
            profile = cProfile.Profile() if "--profile" in sys.argv else None
            collected_before = collector.ms
            start = time.perf_counter()
            if profile:
                profile.enable()
            out = compiled(x)
            torch.cuda.synchronize()
            first_call = time.perf_counter() - start
            if profile:
                profile.disable()
                write_profile(profile, f"{sys.argv[sys.argv.index('--profile') + 1]}.{name}.txt")
        result[name] = {"first_call_s": round(first_call, 3),
                        "collector_s": round((collector.ms - collected_before) / 1e3, 4),
                        "allclose": bool(torch.allclose(eager, out, atol=2e-2, rtol=2e-2))}
    from torch._dynamo.utils import counters

    result["inductor"] = {k: v for k, v in counters["inductor"].items() if "cache" in k}
    result["autotune_benchmarks"] = benchmarks[0]
    result["kilnd_client_imported"] = "kiln.service.connection" in sys.modules  # whether a Kiln client called kilnd
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""One process of bench/timed_decisions_gpu_bench.py: torch.compile (default
mode) of a model whose compile makes decisions by timing, run once on the
GPU. 4 Llama-style blocks (hidden 1024, grouped-query attention, a sequence
of 333, an odd length whose matmuls pad_mm times padded and unpadded) and a
GroupNorm, SiLU, conv and upsample head, in bf16; inductor's reductions
autotune their configs at their first call.

TIMED_SEQUENCE and TIMED_MLP (the environment) set the sequence length and
the MLP's width (2816): which dimensions pad_mm finds misaligned, and by
how much padding wins or loses.

Prints one JSON line: first_call_s, kernels (each Triton kernel the graph
loaded, by name: its chosen config), pattern_matches (the pattern matcher's
count), correct (close to eager)."""

import gc
import json
import os

import torch
import torch.nn.functional as F
from first_call import timed_first_call

HIDDEN, HEADS, KV_HEADS = 1024, 16, 4
SEQUENCE = int(os.environ.get("TIMED_SEQUENCE", "333"))
MLP = int(os.environ.get("TIMED_MLP", "2816"))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        head = HIDDEN // HEADS
        self.norm1, self.norm2 = torch.nn.RMSNorm(HIDDEN), torch.nn.RMSNorm(HIDDEN)
        self.q = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.kv = torch.nn.Linear(HIDDEN, 2 * KV_HEADS * head, bias=False)
        self.out = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.gate = torch.nn.Linear(HIDDEN, MLP, bias=False)
        self.up = torch.nn.Linear(HIDDEN, MLP, bias=False)
        self.down = torch.nn.Linear(MLP, HIDDEN, bias=False)

    def forward(self, x):
        batch, length, _ = x.shape
        head = HIDDEN // HEADS
        h = self.norm1(x)
        q = self.q(h).view(batch, length, HEADS, head).transpose(1, 2)
        k, v = self.kv(h).view(batch, length, 2, KV_HEADS, head).permute(2, 0, 3, 1, 4)
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attention.transpose(1, 2).reshape(batch, length, HIDDEN))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(4))
        self.norm = torch.nn.GroupNorm(8, 64)
        self.conv = torch.nn.Conv2d(64, 32, 3, padding=1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        batch = x.shape[0]
        image = x[:, :324, :].reshape(batch, 18, 18, 64, 16).mean(-1).permute(0, 3, 1, 2)
        image = self.conv(F.silu(self.norm(image)))
        return F.interpolate(image, scale_factor=2, mode="nearest")


def chosen_configs():
    """{kernel name: its config} of every autotuned Triton kernel loaded."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    chosen = {}
    for candidate in gc.get_objects():
        if not issubclass(type(candidate), CachingAutotuner):  # type(): a dead weak proxy raises at isinstance
            continue
        name = (getattr(candidate, "inductor_meta", None) or {}).get("kernel_name")
        if name:
            launchers = getattr(candidate, "launchers", None) or []
            chosen[name] = str(launchers[0].config) if len(launchers) == 1 else f"{len(launchers)} launchers"
    return chosen


def main():
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = Model().cuda().to(torch.bfloat16).eval()
    x = torch.randn(2, SEQUENCE, HIDDEN, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        eager = model(x)
        out, seconds = timed_first_call(torch.compile(model), x)
    print(json.dumps({"first_call_s": round(seconds, 3), "kernels": chosen_configs(),
                      "pattern_matches": counters["inductor"]["pattern_matcher_count"],
                      "correct": bool(torch.allclose(eager.float(), out.float(), atol=5e-2, rtol=5e-2))}))


if __name__ == "__main__":
    main()

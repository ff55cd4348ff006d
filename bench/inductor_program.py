"""One process of bench/inductor_gpu_bench.py: torch.compile a model on the
GPU, time its first call (the graph's compile included), check it against
eager, and print one JSON line.

usage: inductor_program.py deep|transformer

deep: a training step (forward and backward) of a transformer of 4 blocks of
different widths, each with RMSNorm, rotary embeddings and a SwiGLU MLP: its
graphs hold about 60 distinct Triton kernels (widths differ, so inductor
cannot share one block's kernels with the next). transformer: the 2-block
fp16 inference transformer of tests/gpu/inductor_program.py (8 kernels).

Prints: first_call_s, triton_kernels (how many inductor compiled or loaded),
correct (outputs, and for deep the input's gradient, close to eager's)."""

import json
import os
import sys

import torch
from first_call import timed_first_call

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))


class RMSNorm(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


class DeepBlock(torch.nn.Module):
    def __init__(self, width, out_width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(width), RMSNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.proj = torch.nn.Linear(width, width, bias=False)
        self.gate = torch.nn.Linear(width, 3 * width, bias=False)
        self.up = torch.nn.Linear(width, 3 * width, bias=False)
        self.down = torch.nn.Linear(3 * width, width, bias=False)
        self.out = torch.nn.Linear(width, out_width, bias=False)

    def forward(self, x):
        batch, seq, width = x.shape
        head = width // self.heads
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, head).unbind(2)
        angles = torch.arange(seq, device=x.device, dtype=torch.float32)[:, None] * torch.exp(
            torch.arange(head // 2, device=x.device, dtype=torch.float32) * (-4.0 / head))
        cos, sin = angles.cos()[None, :, None, :].to(x.dtype), angles.sin()[None, :, None, :].to(x.dtype)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        attention = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, seq, width))
        hidden = self.norm2(x)
        x = x + self.down(torch.nn.functional.silu(self.gate(hidden)) * self.up(hidden))
        return torch.nn.functional.gelu(self.out(x))


class Deep(torch.nn.Module):
    WIDTHS = (256, 384, 512, 640, 768)

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(*(DeepBlock(width, out, heads=4)
                                            for width, out in zip(self.WIDTHS, self.WIDTHS[1:])))
        self.norm = torch.nn.LayerNorm(self.WIDTHS[-1])

    def forward(self, x):
        return self.norm(self.blocks(x))


def triton_kernels():
    from torch._dynamo.utils import counters

    return sum(v for k, v in counters["inductor"].items() if k.startswith("async_compile_cache_"))


def deep():
    model = Deep().cuda()
    x = torch.randn(8, 128, Deep.WIDTHS[0], device="cuda", requires_grad=True)
    eager = model(x)
    eager.square().mean().backward()
    eager_grad, x.grad = x.grad.clone(), None
    compiled = torch.compile(model)

    def forward_and_backward(x):
        out = compiled(x)
        out.square().mean().backward()
        return out
    out, seconds = timed_first_call(forward_and_backward, x)
    correct = bool(torch.allclose(out, eager, atol=1e-3, rtol=1e-3) and
                   torch.allclose(x.grad, eager_grad, atol=1e-4, rtol=1e-2))
    return seconds, correct


def transformer():
    from inductor_program import Transformer

    model = Transformer(512).cuda().half().eval()
    x = torch.randn(4, 128, 512, device="cuda", dtype=torch.half)
    with torch.no_grad():
        eager = model(x)
        out, seconds = timed_first_call(torch.compile(model), x)
    return seconds, bool(torch.allclose(eager, out, atol=2e-2, rtol=2e-2))


def main():
    torch.manual_seed(0)
    seconds, correct = {"deep": deep, "transformer": transformer}[sys.argv[1]]()
    print(json.dumps({"first_call_s": round(seconds, 3), "triton_kernels": triton_kernels(), "correct": correct}))


if __name__ == "__main__":
    main()

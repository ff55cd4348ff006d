"""Programs run on the GPU machine by gpu_checks.py, each in a fresh process.

usage: gpu_programs.py add|models
"""

import sys

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    output = x + y
    tl.store(output_ptr + offsets, output, mask=mask)


def add(x: torch.Tensor, y: torch.Tensor):
    output = torch.empty_like(x)
    n_elements = output.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)  # noqa: E731
    add_kernel[grid](x, y, output, n_elements, BLOCK_SIZE=1024)
    return output


def run_add():
    # The triton-windows README's smoke test: prints zeros.
    a = torch.rand(3, device="cuda")
    b = a + a
    b_compiled = add(a, a)
    print(b_compiled - b)
    return bool(torch.equal(b_compiled, b))


class MLP(torch.nn.Module):
    def __init__(self, width=256):
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


class Attention(torch.nn.Module):
    def __init__(self, width=256, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm(x)).view(batch, seq, 3, self.heads, width // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        weights = torch.softmax(q @ k.transpose(-1, -2) / (width // self.heads) ** 0.5, dim=-1)
        mixed = (weights @ v).transpose(1, 2).reshape(batch, seq, width)
        return x + self.out(mixed)


def run_models():
    torch.manual_seed(0)
    ok = True
    for model in (MLP().cuda(), Attention().cuda()):
        x = torch.randn(8, 64, 256, device="cuda")
        with torch.no_grad():
            eager = model(x)
            compiled = torch.compile(model)(x)
        same = torch.allclose(eager, compiled, atol=1e-4, rtol=1e-4)
        print(f"{type(model).__name__}: torch.compile vs eager max |diff| "
              f"{(eager - compiled).abs().max().item():.2e} allclose={same}")
        ok = ok and same
    return ok


if __name__ == "__main__":
    passed = {"add": run_add, "models": run_models}[sys.argv[1]]()
    sys.exit(0 if passed else 1)

"""A warm hit, stock Triton against Kiln, paired inside one process: on the CPU,
fresh processes differ from each other by more than the whole cache step of a
hit (about 0.1 ms of a 1.3 ms triton.compile hit), so a per-kernel ratio from
separate processes (bench/warm_bench.py) is mostly noise. Here both caches are
warm, the same interpreter alternates between them round by round, and each
kernel's median is compared:

  cache step        Triton's cache manager for the kernel's key, and its group
                    lookup: stock's FileCacheManager against KilnCacheManager
                    (kilnd's served files, no call)
  triton.compile    the whole hit: key, lookup, reading the group

The 15-kernel suite at sm80 and sm90, kilnd started from BUILD_DIR. On the GPU
machine, --gpu compiles for its GPU only and each triton.compile hit also loads
the kernel onto the GPU (CompiledKernel._init_handles): from asking Triton to a
launchable kernel, as bench/gpu_bench.py times it in fresh processes.
usage: python bench/hit_paths_bench.py [--build-dir build | --bundle gpu_bundle] [--rounds 21] [--gpu]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import hermetic  # noqa: E402  (tests/hermetic.py)

ROOT = Path(__file__).resolve().parents[1]

POPULATE = r"""
import sys
sys.path.insert(0, sys.argv[1])
import triton, kernel_suite
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
for case in kernel_suite.SUITE:
    for arch in map(int, sys.argv[2].split(",")):
        triton.compile(ASTSource(case.fn, case.signature, case.constexprs), target=GPUTarget("cuda", arch, 32),
                       options=case.options)
"""

MEASURE = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
stock_dir, kiln_dir, rounds = sys.argv[2], sys.argv[3], int(sys.argv[4])
arches, on_gpu = [int(arch) for arch in sys.argv[5].split(",")], sys.argv[6] == "gpu"
import triton, kernel_suite
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from triton.runtime.cache import FileCacheManager, _base32
from kiln._cache import KilnCacheManager

cases = [(f"{case.name}-sm{arch}", ASTSource(case.fn, case.signature, case.constexprs),
          GPUTarget("cuda", arch, 32), case.options) for case in kernel_suite.SUITE for arch in arches]
manager_of = {"stock": FileCacheManager, "kiln": KilnCacheManager}
dir_of = {"stock": stock_dir, "kiln": kiln_dir}
groups = {}  # (kind, name) -> (key, group file name), as triton.compile asks

def use(kind):
    knobs.cache.dir = dir_of[kind]
    knobs.cache.manager_class = manager_of[kind]

def compile_hits(kind):
    use(kind)
    times = {}
    for name, source, target, options in cases:
        start = time.perf_counter()
        kernel = triton.compile(source, target=target, options=options)
        if on_gpu:
            kernel._init_handles()  # the module loaded: a launchable kernel
        times[name] = time.perf_counter() - start
        groups[(kind, name)] = (kernel.hash, f"{kernel.name}.json")
    return times

def cache_steps(kind):
    use(kind)
    manager = manager_of[kind]
    times = {}
    for name, *_ in cases:
        key, group_name = groups[(kind, name)]
        start = time.perf_counter()
        group = manager(_base32(key)).get_group(group_name)
        times[name] = time.perf_counter() - start
        assert group and group_name in group, (kind, name)
    return times

compile_hits("stock"), compile_hits("kiln")  # both warm in this process too
runs = {("stock", "compile"): [], ("kiln", "compile"): [], ("stock", "cache"): [], ("kiln", "cache"): []}
for round_ in range(rounds):
    for kind in (("stock", "kiln") if round_ % 2 == 0 else ("kiln", "stock")):
        runs[(kind, "compile")].append(compile_hits(kind))
        runs[(kind, "cache")].append(cache_steps(kind))
medians = {f"{kind} {what}": {name: statistics.median(run[name] for run in done) * 1e3 for name, *_ in cases}
           for (kind, what), done in runs.items()}
print(json.dumps(medians))
"""


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build")
    parser.add_argument("--bundle", type=Path, help="kilnd and kiln from scripts/make-gpu-bundle's folder")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--gpu", action="store_true", help="this machine's GPU only, each hit loaded onto it")
    args = parser.parse_args()
    if args.bundle:
        kilnd_path, kiln_path = args.bundle / "kilnd", args.bundle / "kiln"
        os.environ["LD_LIBRARY_PATH"] = str(args.bundle / "lib")
    else:
        kilnd_path = args.build_dir / "service" / "kilnd"
        kiln_path = args.build_dir / "client" / "cpp" / "kiln"
    if args.gpu:
        import torch

        major, minor = torch.cuda.get_device_capability()
        arches = f"{major}{minor}"
    else:
        arches = "80,90"
    work = Path(tempfile.mkdtemp(prefix="kiln-hit-paths-"))
    tests = str(ROOT / "tests" / "python")
    base = hermetic.stock_env()
    subprocess.run([sys.executable, "-c", POPULATE, tests, arches], env=dict(base, TRITON_CACHE_DIR=str(work / "stock")),
                   check=True)
    socket = work / "kilnd.sock"
    kilnd = subprocess.Popen([str(kilnd_path), f"--data-dir={work / 'data'}",
                              f"--local-socket={socket}", f"--toolchain={sys.executable}", "--log-level=warn"])
    try:
        subprocess.run([str(kiln_path), "--endpoint", f"unix:{socket}", "health",
                        "--wait", "60"], check=True, stdout=subprocess.DEVNULL)
        kiln_env = dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{socket}",
                        KILN_FILES_DIR=str(work / "files"))
        # kilnd compiles the suite, then serves it as files to a second process.
        for name in ("k1", "k2"):
            subprocess.run([sys.executable, "-c", POPULATE, tests, arches],
                           env=dict(kiln_env, TRITON_CACHE_DIR=str(work / name)), check=True)
        result = subprocess.run([sys.executable, "-c", MEASURE, tests, str(work / "stock"), str(work / "k3"),
                                 str(args.rounds), arches, "gpu" if args.gpu else "cpu"], env=kiln_env,
                                capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(result.stderr[-3000:])
        medians = json.loads(result.stdout.splitlines()[-1])
    finally:
        kilnd.terminate()
        kilnd.wait()

    print(f"warm hits in one process, median of {args.rounds} alternating rounds (ms)"
          + (", compile = to a kernel loaded on the GPU" if args.gpu else ""))
    print(f"{'kernel':34} {'stock cache':>11} {'kiln cache':>10} {'ratio':>6} | {'stock compile':>13} "
          f"{'kiln compile':>12} {'ratio':>6}")
    for name in medians["stock cache"]:
        sc, kc = medians["stock cache"][name], medians["kiln cache"][name]
        st, kt = medians["stock compile"][name], medians["kiln compile"][name]
        print(f"{name:34} {sc:11.3f} {kc:10.3f} {kc / sc:6.2f} | {st:13.3f} {kt:12.3f} {kt / st:6.2f}")
    totals = {label: sum(values.values()) for label, values in medians.items()}
    print(f"{'total':34} {totals['stock cache']:11.3f} {totals['kiln cache']:10.3f} "
          f"{totals['kiln cache'] / totals['stock cache']:6.2f} | {totals['stock compile']:13.3f} "
          f"{totals['kiln compile']:12.3f} {totals['kiln compile'] / totals['stock compile']:6.2f}")
    worst = max(medians["stock cache"], key=lambda n: medians["kiln cache"][n] / medians["stock cache"][n])
    print(f"cache step, worst kernel: {worst} "
          f"{medians['kiln cache'][worst] / medians['stock cache'][worst]:.2f}x stock")


if __name__ == "__main__":
    main()

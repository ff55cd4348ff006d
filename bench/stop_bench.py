"""How long SIGTERM takes to end kilnd while it works (issue 53: a stop takes
at most 2 s whatever kilnd is doing; systemd kills a service after 90 s, and
Windows' service manager gives far less). bench/store_bench.py measures it idle
and in the middle of an eviction at a million entries; this measures the
phases that hold a client's work in flight:

  compile   a kernel that takes seconds to compile (tests/python/long_compile_program.py,
            --steps 600: about 17 s with stock Triton on the 2-core machine) sent
            to kilnd by the Python client; SIGTERM once kilnd's processes used
            a second of CPU on it. The client must then compile it itself
            (stock Triton, one warning), and kilnd store nothing of it.
  import    `kiln import` of a bundle of --entries entries of 1-4 KiB; SIGTERM
            once the first entries are in.
  idle      nothing in flight, for comparison.

Each phase runs --repeat times on a kilnd of its own (temp data dir and socket,
this account's kilnd and caches untouched); printed: the seconds from SIGTERM
to kilnd's exit (median and max), kilnd's exit status, and in the compile
phase how long stock Triton takes for the same kernel, measured in the same run.

usage: python bench/stop_bench.py [--build-dir build] [--repeat 3] [--steps 600] [--entries 4000]
"""

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "client" / "python")]

import grpc  # noqa: E402

import hermetic  # noqa: E402  (tests/hermetic.py)
import process_table  # noqa: E402
from kiln.service import api as _api  # noqa: E402

LONG_COMPILE = ROOT / "tests" / "python" / "long_compile_program.py"
FALLBACK_WARNING = "compiling with stock Triton instead"
LIMIT = 120  # seconds any wait gets


class Kilnd:
    def __init__(self, build_dir, root, *flags):
        self.root = root
        self.socket = root / "kilnd.sock"
        root.mkdir(parents=True)
        self.log = open(root / "kilnd.out", "w")
        self.process = subprocess.Popen(
            [str(build_dir / "service" / "kilnd"), f"--data-dir={root / 'data'}", f"--local-socket={self.socket}",
             f"--log-dir={root / 'logs'}", *flags], stdout=self.log, stderr=subprocess.STDOUT)
        self.channel = grpc.insecure_channel(f"unix:{self.socket}")
        grpc.channel_ready_future(self.channel).result(timeout=LIMIT)
        self.stub = _api.KilnStub(self.channel)

    def entries(self):
        return self.stub.GetStats(_api.GetStatsRequest(), timeout=LIMIT).entries

    def sigterm(self):
        """Seconds from SIGTERM to exit, and the exit status."""
        began = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            status = f"killed after {LIMIT} s"
        took = time.monotonic() - began
        self.channel.close()
        self.log.close()
        return took, status


def wait_until(condition):
    deadline = time.monotonic() + LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("waited too long")
        time.sleep(0.02)


def stop_mid_compile(args, work, env):
    kilnd = Kilnd(args.build_dir, work / "kilnd", f"--toolchain={sys.executable}", "--compile-workers=1")
    idle_cpu = process_table.tree_cpu_seconds(kilnd.process.pid)
    client_env = dict(env, KILN="1", KILN_ENDPOINT=f"unix:{kilnd.socket}", TRITON_CACHE_DIR=str(work / "client-cache"),
                      KILN_FILES_DIR=str(work / "client-files"))
    client = subprocess.Popen([sys.executable, str(LONG_COMPILE), str(args.steps)], env=client_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: process_table.tree_cpu_seconds(kilnd.process.pid) >= idle_cpu + 1 or client.poll() is not None)
    if client.poll() is not None:
        raise RuntimeError(f"the client ended before kilnd compiled:\n{client.stderr.read()[-2000:]}")
    took, status = kilnd.sigterm()
    _, err = client.communicate(timeout=600)
    note = "client fell back to stock" if client.returncode == 0 and err.count(FALLBACK_WARNING) == 1 else \
        f"client exit {client.returncode}, {err.count(FALLBACK_WARNING)} warnings"
    return took, status, note


def stop_mid_import(args, work, env, bundle):
    bundle, public_key = bundle
    kilnd = Kilnd(args.build_dir, work / "kilnd", f"--trusted-bundle-keys={public_key}")
    importing = subprocess.Popen([str(args.build_dir / "client" / "cpp" / "kiln"), "--endpoint",
                                  f"unix:{kilnd.socket}", "import", str(bundle)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: kilnd.entries() > 0 or importing.poll() is not None)
    if importing.poll() is not None:
        raise RuntimeError("the import ended before the stop: raise --entries")
    took, status = kilnd.sigterm()
    importing.communicate(timeout=LIMIT)
    return took, status, f"kiln import exit {importing.returncode}"


def stop_idle(args, work, env):
    return (*Kilnd(args.build_dir, work / "kilnd").sigterm(), "")


def make_bundle(args, work):
    kilnd = Kilnd(args.build_dir, work / "source")
    rng = random.Random(53)

    def put(index):
        kilnd.stub.Put(_api.PutRequest(namespace="stop-bench", key=f"entry{index}",
                                       blobs=[_api.blob("k.bin", rng.randbytes(rng.randint(1024, 4096)))]),
                       timeout=LIMIT)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(args.entries)))
    bundle = work / "bench.kilnbundle"
    # Signed by a key the importing kilnd trusts: its entries are stored as they are.
    key, public_key = work / "publisher.pem", work / "publisher.pub.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(public_key)], check=True,
                   capture_output=True)
    subprocess.run([str(args.build_dir / "client" / "cpp" / "kiln"), "--endpoint", f"unix:{kilnd.socket}",
                    "export", str(bundle), "--sign", str(key)], check=True, capture_output=True)
    kilnd.sigterm()
    return bundle, public_key


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--entries", type=int, default=4000)
    args = parser.parse_args()
    args.build_dir = args.build_dir.resolve()
    hermetic.enter()  # none of this account's kilnd, caches or files
    env = hermetic.stock_env()
    with tempfile.TemporaryDirectory(prefix="kiln-stop-bench-") as temp:
        temp = Path(temp)
        began = time.monotonic()
        stock = subprocess.run([sys.executable, str(LONG_COMPILE), str(args.steps)],
                               env=dict(env, TRITON_CACHE_DIR=str(temp / "stock-cache")), capture_output=True)
        stock_seconds = time.monotonic() - began
        if stock.returncode != 0:
            sys.exit(f"stock Triton failed to compile the kernel:\n{stock.stderr.decode()[-2000:]}")
        print(f"{os.cpu_count()} CPUs; the kernel (--steps {args.steps}) takes stock Triton {stock_seconds:.1f} s")
        bundle = make_bundle(args, temp / "bundle")
        phases = {"compile": lambda work: stop_mid_compile(args, work, env),
                  "import": lambda work: stop_mid_import(args, work, env, bundle),
                  "idle": lambda work: stop_idle(args, work, env)}
        print(f"{'phase':<8} {'stop s median':>13} {'max':>6}  exit statuses, and what the client saw")
        worst = 0.0
        for name, phase in phases.items():
            runs = [phase(temp / f"{name}-{round_}") for round_ in range(args.repeat)]
            seconds = [took for took, _, _ in runs]
            worst = max(worst, max(seconds))
            print(f"{name:<8} {statistics.median(seconds):>13.2f} {max(seconds):>6.2f}  "
                  f"{', '.join(str(status) for _, status, _ in runs)}; {runs[-1][2]}")
        print(f"{'ok  ' if worst <= 2 else 'MISS'} SIGTERM <= 2 s in every phase: {worst:.2f} s at most")


if __name__ == "__main__":
    main()

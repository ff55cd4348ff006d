"""Compile time and CPU of the kernel suite through kilnd versus stock Triton,
measured in one run on one machine.

  1 client:  wall time of the suite's compile loop in a fresh process, stock
             triton.compile (empty file cache) vs through a kilnd with an empty
             cache whose toolchain worker is already running (kilnd is a
             long-lived service).
  N clients: N processes compile the whole suite at once (the multi-process
             case: ranks, inductor workers). Total CPU of every process
             involved (clients, kilnd, its workers, ptxas), stock vs kilnd, and
             relative to one kilnd client.

usage: python bench/compile_bench.py [--clients 4 8] [--build-dir build]
"""

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import hermetic  # noqa: E402  (tests/hermetic.py)

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "bench" / "compile_client.py"


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Kilnd:
    def __init__(self, build_dir, work):
        self.socket = work / "kilnd.sock"
        self.process = subprocess.Popen(
            [str(build_dir / "service" / "kilnd"), f"--data-dir={work / 'data'}",
             f"--local-socket={self.socket}", f"--toolchain={sys.executable}", "--log-level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kiln = build_dir / "client" / "cpp" / "kiln"
        subprocess.run([str(kiln), "--endpoint", self.endpoint, "health", "--wait", "60"], check=True,
                       stdout=subprocess.DEVNULL)

    @property
    def endpoint(self):
        return f"unix:{self.socket}"

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait()


def run_clients(mode, count, endpoint, cache_root):
    """Starts `count` clients at once; returns their wall times."""
    processes = []
    for index in range(count):
        env = dict(os.environ, TRITON_CACHE_DIR=str(cache_root / f"client{index}"))
        # Stock clients share one cache dir, as processes on one machine do.
        if mode == "stock":
            env["TRITON_CACHE_DIR"] = str(cache_root / "shared")
        processes.append(subprocess.Popen([sys.executable, str(CLIENT), mode, endpoint or "-"],
                                          stdout=subprocess.PIPE, text=True, env=env))
    times = []
    for process in processes:
        out, _ = process.communicate()
        if process.returncode != 0:
            sys.exit(f"a {mode} client failed")
        times.append(float(out))
    return times


def scenario(mode, clients, build_dir):
    """Wall time (slowest client) and total CPU of one scenario, from scratch."""
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as work:
        work = Path(work)
        cpu_before = children_cpu()
        server = Kilnd(build_dir, work) if mode == "kiln" else None
        times = run_clients(mode, clients, server.endpoint if server else None, work)
        if server:
            server.stop()  # its workers exit and are reaped, so their CPU is counted
        return max(times), children_cpu() - cpu_before


def startup_cpu(clients):
    """CPU that `clients` client processes spend starting (Python, imports, triton_key)."""
    cpu_before = children_cpu()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as work:
        run_clients("startup", clients, None, Path(work))
    return children_cpu() - cpu_before


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, nargs="*", default=[4, 8])
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build")
    args = parser.parse_args()
    print(f"kernel suite: 15 kernels x sm80, sm90 = 30 compiles; {os.cpu_count()} CPUs")
    # Single-client runs are short: take the median of three to tame noise.
    stock_runs = sorted(scenario("stock", 1, args.build_dir) for _ in range(3))
    kiln_runs = sorted(scenario("kiln", 1, args.build_dir) for _ in range(3))
    (stock_wall, stock_cpu), (kiln_wall, kiln_cpu) = stock_runs[1], kiln_runs[1]
    kiln_compile_cpu = kiln_cpu - startup_cpu(1)
    print(f"{'clients':>7} {'stock wall':>10} {'kiln wall':>9} {'kiln/stock':>10} | {'stock CPU':>9} "
          f"{'kiln CPU':>8} {'kiln/stock':>10} | {'startup':>7} {'kiln compile CPU':>16} {'vs 1 client':>11}")
    row = "{:>7} {:>9.2f}s {:>8.2f}s {:>10.2f} | {:>8.1f}s {:>7.1f}s {:>10.2f} | {:>6.1f}s {:>15.1f}s {:>11.2f}"
    print(row.format(1, stock_wall, kiln_wall, kiln_wall / stock_wall, stock_cpu, kiln_cpu,
                     kiln_cpu / stock_cpu, kiln_cpu - kiln_compile_cpu, kiln_compile_cpu, 1.0))
    for clients in args.clients:
        stock_n_wall, stock_n_cpu = scenario("stock", clients, args.build_dir)
        kiln_n_wall, kiln_n_cpu = scenario("kiln", clients, args.build_dir)
        startup = startup_cpu(clients)
        print(row.format(clients, stock_n_wall, kiln_n_wall, kiln_n_wall / stock_n_wall, stock_n_cpu,
                         kiln_n_cpu, kiln_n_cpu / stock_n_cpu, startup, kiln_n_cpu - startup,
                         (kiln_n_cpu - startup) / kiln_compile_cpu))
    print("wall: slowest client's compile loop. CPU: every process involved (clients, kilnd, workers,\n"
          "ptxas). startup: what the client processes cost before compiling (Python, imports,\n"
          "triton_key()), measured separately; 'kiln compile CPU' is kiln CPU less startup.")


if __name__ == "__main__":
    main()

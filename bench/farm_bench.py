"""A fleet of kilnds sharing one Redis (issue 15) against one kilnd, on one machine.

Every scenario starts with empty caches (kilnd, Redis, each client's Triton cache);
N client processes (default 8) import Triton, then start together and compile the
kernel suite (15 kernels x sm80, sm90 = 30 compiles) through the Python client,
as an application with KILN=1 does.

  1. one kilnd, no Redis: every client on it;
  2. three kilnds sharing one Redis: each client lists all three in KILN_ENDPOINT
     (the deployment README recommends), so each kernel's calls go to the kilnd
     its key ranks first (kiln/service/fleet.py) and different kernels spread;
  2b. the same with client i on kilnd i % 3 only: a kernel's claims then meet
     only through Redis, and each kilnd's clients run its frontend (the Compile
     calls printed count the frontends the clients ran);
  3. a fresh kilnd with an empty cache joins scenario 2's Redis; every client on
     it: nothing should compile, all 30 results come from Redis (L2 hits).

Printed per scenario: wall time from the start signal until the last client exits,
compiles run (per kilnd and in all: 30 expected in 1, 2, 2b; 0 in 3), calls, L2 hits
and compiles awaited from another kilnd's claim, the L2 hit latency p50/p99 (where
kilnd reports it), and wall time relative to one kilnd's.

All kilnds share this machine's CPUs, so the fleet cannot beat one kilnd in wall
time here (on 2 cores it runs three kilnds' workers on the cores one had alone).
What one machine shows is the compile count across the fleet (each kernel compiled
once, not once per kilnd) and what going through Redis costs.

usage: python bench/farm_bench.py [--build-dir build] [--clients 8]
       (needs redis-server: Debian package redis-server)
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import hermetic  # noqa: E402  (tests/hermetic.py)

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "farm-bench"
ARCHES = (80, 90)


def client():
    """One client process: prints "ready" once started, compiles on a line on stdin."""
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    import kernel_suite
    import triton
    from kiln.triton import remote as _triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource
    from triton.runtime.cache import triton_key

    # What every process pays before its first compile, stock or not (imports,
    # hashing Triton's sources, connecting to kilnd), stays out of the timing.
    triton_key()
    assert _triton.active(), "the Kiln client did not activate"
    print("ready", flush=True)
    sys.stdin.readline()
    for case in kernel_suite.SUITE:
        for arch in ARCHES:
            triton.compile(ASTSource(case.fn, case.signature, case.constexprs),
                           target=GPUTarget("cuda", arch, 32), options=case.options)


class Kilnd:
    def __init__(self, build_dir, directory, redis_port=None, redis_prefix=None):
        self.kiln = build_dir / "client" / "cpp" / "kiln"
        directory.mkdir(parents=True)
        config = directory / "kilnd.conf"
        # TCP because a client can list several kilnds only as HOST:PORT; one kilnd
        # is reached the same way so that the scenarios differ only in the fleet.
        settings = "tcp_listen = 127.0.0.1:0\n"
        if redis_port:
            settings += f"redis_url = redis://:{PASSWORD}@127.0.0.1:{redis_port}\nredis_prefix = {redis_prefix}\n"
        config.write_text(settings)
        self.socket = directory / "kilnd.sock"
        self.log = directory / "kilnd.out"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [str(build_dir / "service" / "kilnd"), f"--config={config}", f"--data-dir={directory / 'data'}",
                 f"--local-socket={self.socket}", f"--toolchain={sys.executable}"],
                stdout=log, stderr=subprocess.STDOUT)
        if subprocess.run([str(self.kiln), "--endpoint", f"unix:{self.socket}", "health", "--wait", "60"],
                          stdout=subprocess.DEVNULL).returncode != 0:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"kilnd did not start:\n{self.log.read_text()[-3000:]}")
        self.address = re.search(r"127\.0\.0\.1:\d+", self.log.read_text()).group(0)

    def stats(self):
        out = subprocess.run([str(self.kiln), "--endpoint", f"unix:{self.socket}", "stats", "--json"],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_kilnd(*args):
    # The build dir may be relinked under us (ETXTBSY, or a binary half written):
    # one more try a little later.
    try:
        return Kilnd(*args)
    except (OSError, RuntimeError) as error:
        print(f"kilnd failed to start ({str(error)[:300]}); trying once more in 20 s", file=sys.stderr)
        time.sleep(20)
        shutil.rmtree(args[1], ignore_errors=True)
        return Kilnd(*args)


def start_redis(directory, redis):
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--requirepass", PASSWORD,
         "--save", "", "--appendonly", "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    redis.append(process)
    deadline = time.monotonic() + 30
    while subprocess.run(["redis-cli", "-p", str(port), "-a", PASSWORD, "--no-auth-warning", "PING"],
                         capture_output=True, text=True).stdout.strip() != "PONG":
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError("redis-server did not start")
        time.sleep(0.1)
    return port


def redis_memory(port):
    """Redis's memory in use and its keys (for sizing maxmemory)."""
    def cli(*args):
        return subprocess.run(["redis-cli", "-p", str(port), "-a", PASSWORD, "--no-auth-warning", *args],
                              capture_output=True, text=True).stdout
    used = re.search(r"used_memory:(\d+)", cli("INFO", "memory")).group(1)
    baseline = re.search(r"used_memory_startup:(\d+)", cli("INFO", "memory")).group(1)
    return f"{(int(used) - int(baseline)) / 1e6:.1f} MB over an empty server, {cli('DBSIZE').strip()} keys"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_clients(count, endpoints, work, started):
    """Starts `count` clients, client i on endpoints[i % len(endpoints)], waits until
    all are ready, then lets them compile at once; returns the seconds from that
    signal until the last one exited."""
    base = hermetic.stock_env()
    clients, logs = [], []
    for index in range(count):
        directory = work / f"client{index}"
        directory.mkdir(parents=True)
        env = dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=endpoints[index % len(endpoints)],
                   TRITON_CACHE_DIR=str(directory / "triton"), KILN_FILES_DIR=str(directory / "files"))
        # stderr to a file: a pipe nobody reads until the end could fill and stall a client.
        logs.append(directory / "stderr")
        with open(logs[-1], "w") as stderr:
            clients.append(subprocess.Popen([sys.executable, __file__, "--client"], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env))
        started.append(clients[-1])
    for process, log in zip(clients, logs):
        if process.stdout.readline().strip() != "ready":
            process.wait()
            raise RuntimeError(f"a client failed to start:\n{log.read_text()[-3000:]}")
    start = time.perf_counter()
    for process in clients:
        process.stdin.write("go\n")
        process.stdin.flush()
    for process, log in zip(clients, logs):
        process.communicate(timeout=1800)
        if process.returncode != 0:
            raise RuntimeError(f"a client failed:\n{log.read_text()[-3000:]}")
    return time.perf_counter() - start


def field(stats, snake):
    """A stats field under its proto name or its lowerCamelCase JSON name."""
    camel = re.sub(r"_(\w)", lambda match: match.group(1).upper(), snake)
    return stats.get(snake, stats.get(camel))


def hit_latency(stats):
    latency = field(stats, "shared_cache_hit_latency")
    if latency is None:
        return "n/a (kilnd does not report it)"
    return (f"p50 {float(field(latency, 'p50_ms') or 0):.2f} ms, p99 {float(field(latency, 'p99_ms') or 0):.2f} ms "
            f"over {int(field(latency, 'count') or 0)} hits")


def report(name, wall, fleet, with_redis=True):
    stats = [kilnd.stats() for kilnd in fleet]
    count = lambda key: [int(field(s, key) or 0) for s in stats]  # noqa: E731  (uint64 comes as a string)
    # Calls each kilnd answered (its own stats calls aside) say how evenly the fleet
    # spread the clients; Compile calls, how many frontends the clients ran and sent.
    calls = lambda wanted: [sum(int(field(rpc, "count") or 0) for rpc in field(s, "rpc_latency") or []  # noqa: E731
                                if wanted(rpc.get("method"))) for s in stats]
    print(f"{name}\n  wall {wall:.1f} s; compiles {sum(count('compiles'))} (per kilnd {count('compiles')})\n"
          f"  calls per kilnd {calls(lambda method: method != 'GetStats')}, "
          f"of them Compile {calls(lambda method: method == 'Compile')}")
    if with_redis:
        print(f"  L2 hits {count('shared_cache_hits')}, compiles awaited {count('shared_cache_compiles_awaited')}, "
              f"L2 errors {count('shared_cache_errors')}")
        for index, one in enumerate(stats):
            print(f"  L2 hit latency, kilnd {index}: {hit_latency(one)}")


def wait_for_stores(fleet, expected):
    # Results reach Redis in the background: a kilnd joining before they all
    # landed would compile, and scenario 3 would measure that instead.
    deadline = time.monotonic() + 120
    while sum(int(field(kilnd.stats(), "shared_cache_stores") or 0) for kilnd in fleet) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError("the fleet's compiles never all reached Redis")
        time.sleep(0.5)


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    if sys.argv[1:] == ["--client"]:
        return client()
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build")
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    build_dir = args.build_dir.resolve()
    for binary in (build_dir / "service" / "kilnd", build_dir / "client" / "cpp" / "kiln"):
        if not os.access(binary, os.X_OK):
            sys.exit(f"{binary} is missing: build Kiln first (cmake --build {args.build_dir})")
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        sys.exit("redis-server is not installed (Debian: apt-get install redis-server)")
    print(f"{os.cpu_count()} CPUs; {args.clients} clients, each compiling 15 kernels x sm80, sm90 = 30 compiles")

    # Everything started is stopped in the end, whatever happens, SIGTERM included.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("farm_bench: terminated"))
    clients, kilnds, redis = [], [], []
    with tempfile.TemporaryDirectory(prefix="kiln-farm-bench-") as work:
        work = Path(work)
        try:
            kilnds.append(start_kilnd(build_dir, work / "single"))
            single_wall = run_clients(args.clients, [kilnds[0].address], work / "clients1", clients)
            report("1. one kilnd, no Redis", single_wall, kilnds[:1], with_redis=False)
            kilnds[0].stop()

            redis_port = start_redis(work, redis)
            walls = {}
            # Each fleet its own prefix: its Redis is as empty as its kilnds.
            for pinned, prefix in ((False, "farm-rr:"), (True, "farm-pinned:")):
                for index in range(3):
                    kilnds.append(start_kilnd(build_dir, work / f"{prefix[:-1]}{index}", redis_port, prefix))
                fleet = kilnds[-3:]
                addresses = [kilnd.address for kilnd in fleet]
                walls[pinned] = run_clients(args.clients, addresses if pinned else [",".join(addresses)],
                                            work / f"clients-{prefix[:-1]}", clients)
                report("2b. three kilnds + Redis, client i on kilnd i % 3" if pinned else
                       "2. three kilnds + Redis, every client listing all three (key affinity)", walls[pinned], fleet)
                if not pinned:
                    stored = sum(int(field(k.stats(), "compiles") or 0) for k in fleet)
                    wait_for_stores(fleet, stored)
                    print(f"  Redis after {stored} compiles (and their launchers): {redis_memory(redis_port)}")
                for kilnd in fleet:
                    kilnd.stop()

            kilnds.append(start_kilnd(build_dir, work / "joiner", redis_port, "farm-rr:"))
            joiner_wall = run_clients(args.clients, [kilnds[-1].address], work / "clients3", clients)
            report("3. a fresh kilnd on scenario 2's Redis, every client on it", joiner_wall, kilnds[-1:])

            print(f"wall time / one kilnd's: fleet, key affinity {walls[False] / single_wall:.2f}, "
                  f"client i on kilnd i % 3 {walls[True] / single_wall:.2f}; "
                  f"fresh kilnd served from Redis {joiner_wall / single_wall:.2f}")
        finally:
            # Clients first: a kilnd being stopped waits for the calls still open.
            for process in clients:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            for kilnd in kilnds:
                kilnd.stop()
            for process in redis:
                process.terminate()
                process.wait()


if __name__ == "__main__":
    main()

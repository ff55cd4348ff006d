"""The store at farm scale (issue 53): what kilnd's store costs as it grows to a
million entries, beside what SQLite itself does on the same disk.

A kilnd of the bench's own (a temp data dir and socket) is filled with entries
of one blob each, 1-4 KiB of random bytes (all distinct: nothing dedups or
compresses) under random hex keys, by --writers processes (16), each with its
own gRPC channel to kilnd's local socket, up to each of --sizes in turn
(cumulative: 100k, then up to 300k, then up to 1M). Each writer sends
--per-call entries a call (32) through PutMany, as bulk writers do (kiln
import, a farm's sync); --per-call 1 puts through Put, one entry a call, as a
client storing one compile's result does (then the 16 Python writers, at about
0.7 ms of CPU a call, are what a 2-core machine runs out of). The puts are those of
a client that reads entries through Lookup (serve_as_files = false: a farm's
clients, the C++ SDK, kiln put, bundle imports); with --as-files they are
those of the Python client, which reads its entries as kilnd's served files
(cache/served_files.h: a copy and a link each, counted in du and files/entry).
At each size, one row:

  put/s         entries stored per second over that fill segment
  bare/s        rows per second bare SQLite inserted over the same segment
  cpu/put       kilnd's CPU time per put in that segment (ms): its own cost,
                apart from the writers' on a machine with few cores
  busy          seconds kilnd kept working after the last put answered (until
                it used under 5% of a core for 0.5 s): work puts leave behind
  hit, miss     p50/p99 ms of 2000 Lookups (blob data in the answer, as a farm's
                remote client gets it) of random stored keys, then of absent keys,
                from one client, once kilnd is idle
  RSS           kilnd's VmRSS (/proc/PID/status)
  du            du -sk of the data dir (kilnd's logs are kept outside it)
  files/entry   files, directories and links under the data dir, per entry
  stats         seconds `kiln stats` takes (the CLI, a process of its own)
  stop, start   seconds SIGTERM takes to stop kilnd, and a new kilnd on the same
                data dir takes to answer grpc.health.v1 Check with SERVING
  disk/du       kilnd's disk_bytes (GetStats) / du: 1 s after that restart, and
                settled (unchanged over 2 s while kilnd used under 5% of a core)

After the last size, kilnd is restarted with max_cache_size at half the data
dir's du, and GetStats is polled every 0.5 s while it evicts, alone, as bare
SQLite's deletes run. Printed: entries freed per second (by the entry count)
from the last poll that saw none gone to the first that saw disk_bytes <= cap,
and that rate / bare SQLite's deletes; the slowest GetStats meanwhile; du / cap
once the count stopped moving. Then again at half of what is left, while one
client looks up keys of the newest 10% (which stay) in a loop: hit p50/p99
while it evicted (and its rate then: a lookup loop takes more than one core of
two, and eviction yields to lookups). Then once more with a cap of a sixteenth of the du left (a long
eviction): SIGTERM 2 s after a GetStats first answered with entries gone (it
waits for eviction batches, so that is 2 s or more into the eviction), and
how long kilnd takes to exit (killed after 30 s); with --stops-mid-eviction
D1,D2..., also D1, D2... seconds into an eviction of the whole store to a
sixteenth of it (a copy of the filled data dir put back before each): run
beside a load (stress-ng --cpu 2) for a loaded machine's. Every wait has a limit: a
kilnd that does not evict, or stop, is reported as such.

Bare SQLite, on the same disk first: Python's sqlite3 with kilnd's durability
(cache/sqlite.cc: journal_mode=WAL, synchronous=NORMAL; SQLite's defaults
otherwise) and kilnd's auto_vacuum=INCREMENTAL, one table (integer id, unique
key text, blob), inserting as many rows of the same sizes in the same segments,
one commit per 512 rows (--writers x --per-call): what a perfect group commit
makes of 16 writers that each wait for their own call's commit. Then it deletes the oldest half, 1024 rows a
transaction, each followed by PRAGMA incremental_vacuum, as eviction must give
the space back.

Targets of issue 53, at 1M entries: put >= 0.5x bare SQLite and >= 1500/s;
eviction >= 5000 entries/s and >= 0.5x bare delete; hit p99 <= 2 ms, also
during eviction; SIGTERM <= 2 s, also mid-eviction; du <= 1.05x cap after
eviction; disk_bytes within 5% of du, also 1 s after a restart; restart <= 2 s;
RSS <= 256 MiB; <= 1.2 files per entry.

usage: python bench/store_bench.py [--sizes 100000,300000,1000000] [--writers 16]
           [--as-files] [--build-dir build] [--evict-timeout 600] [--stops-mid-eviction 1,3,6]
           [--keep]
       (a quick try: --sizes 2000,5000; needs grpcio: run it with .venv's python,
       which it uses itself when the python running it lacks grpc)
"""

import argparse
import hashlib
import multiprocessing
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "client" / "python")]

try:
    import grpc
except ImportError:
    # The benches run in the project's venv; one started with another python goes there.
    venv = Path(os.environ.get("KILN_VENV", ROOT / ".venv"))
    if (venv / "bin" / "python").exists() and Path(sys.prefix).resolve() != venv.resolve():
        os.execv(str(venv / "bin" / "python"), [str(venv / "bin" / "python"), *sys.argv])
    sys.exit("store_bench needs grpcio: run it with the project's venv (.venv/bin/python)")

import hermetic  # noqa: E402  (tests/hermetic.py)
from kiln.service import api as _api  # noqa: E402  (the client's messages and stub)

NAMESPACE = "bench"
BLOB_NAME = "artifact.bin"
BLOB_SIZES = (1024, 4096)
LOOKUPS = 2000
POLL_SECONDS = 0.5
STOP_LIMIT = 30  # seconds SIGTERM gets before kill -9
START_LIMIT = 120  # seconds a kilnd gets to answer Health, or to begin evicting
SETTLE_LIMIT = 120
CALL_TIMEOUT = 60
# GetStats waits for the eviction's batches (seconds each at 20k entries already).
STATS_TIMEOUT = 300
FILL_LIMIT = 3 * 3600  # a segment's writers give up after this long, and say so
FILL_CAP = 1 << 40  # max_cache_size while filling: nothing evicted before the caps come
BARE_DELETES_PER_TRANSACTION = 1024
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                   # A restarted kilnd is found within milliseconds, not after gRPC's 1 s backoff.
                   ("grpc.initial_reconnect_backoff_ms", 10), ("grpc.min_reconnect_backoff_ms", 10),
                   ("grpc.max_reconnect_backoff_ms", 100)]
HEALTH_SERVING = b"\x08\x01"  # grpc.health.v1.HealthCheckResponse{status: SERVING}
EVICTION_DONE_LOG = "cache: evicted "  # what kilnd logs (flushed at once) when an eviction ends


def key_of(salt, index):
    """The hex key of entry `index` (64 digits, as Triton's); any process makes it again from the salt."""
    return hashlib.blake2b(index.to_bytes(8, "little"), key=salt, digest_size=32).hexdigest()


def blob_bytes(rng):
    return os.urandom(rng.randint(*BLOB_SIZES))


def percentile(values, fraction):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def timed_lookup(stub, key):
    """(ms, found) of one Lookup."""
    start = time.perf_counter()
    response = stub.Lookup(_api.LookupRequest(namespace=NAMESPACE, key=key), timeout=CALL_TIMEOUT)
    return (time.perf_counter() - start) * 1e3, response.found


def put_range(stub, rng, salt, entries, as_files, per_call):
    """Puts `entries`, `per_call` a call (Put for one, PutMany for more), one
    call after another: (stored, failed, first error)."""
    stored = failed = 0
    first_error = None
    deadline = time.monotonic() + FILL_LIMIT
    entries = list(entries)
    for first in range(0, len(entries), per_call):
        if time.monotonic() > deadline:
            return stored, failed, first_error or f"stopped at the fill limit ({FILL_LIMIT} s)"
        requests = [_api.PutRequest(namespace=NAMESPACE, key=key_of(salt, entry),
                                    blobs=[_api.blob(BLOB_NAME, blob_bytes(rng))], serve_as_files=as_files)
                    for entry in entries[first:first + per_call]]
        try:
            if per_call == 1:
                stub.Put(requests[0], timeout=CALL_TIMEOUT)
                stored += 1
                continue
            response = stub.PutMany(_api.PutManyRequest(entries=requests), timeout=CALL_TIMEOUT)
        except grpc.RpcError as error:
            failed += len(requests)
            first_error = first_error or f"{error.code().name}: {error.details()}"
            continue
        for result in response.results:
            if result.code == 0:
                stored += 1
            else:
                failed += 1
                first_error = first_error or f"code {result.code}: {result.message}"
    return stored, failed, first_error


def lookup_loop(pipe, stub, rng, salt, low, high):
    """Looks up random keys of low..high-1 until `pipe` says stop:
    ([(time.monotonic() when sent, ms) of each hit], misses, failed calls)."""
    hits, misses, failed = [], 0, 0
    while not pipe.poll():
        sent = time.monotonic()
        try:
            ms, found = timed_lookup(stub, key_of(salt, rng.randrange(low, high)))
        except grpc.RpcError:
            failed += 1
            time.sleep(0.01)  # kilnd stopping: no busy loop
            continue
        if found:
            hits.append((sent, ms))
        else:
            misses += 1
    pipe.recv()  # "stop"
    return hits, misses, failed


def writer(pipe, index, writers, salt):
    """One writer process, driven by commands on `pipe`:
    ("connect", socket): opens its own channel to kilnd; answers "ready";
    ("put", start, end, as_files, per_call): puts the entries of start..end-1 that are
      its own (index % writers); answers put_range's result;
    ("lookups", low, high): lookup_loop until "stop"; answers its result;
    ("disconnect",): closes the channel; answers "closed"."""
    rng = random.Random()
    channel = stub = None
    while True:
        command, *arguments = pipe.recv()
        if command == "connect":
            channel = grpc.insecure_channel(f"unix:{arguments[0]}", options=CHANNEL_OPTIONS)
            grpc.channel_ready_future(channel).result(timeout=START_LIMIT)
            stub = _api.KilnStub(channel)
            pipe.send("ready")
        elif command == "put":
            start, end, as_files, per_call = arguments
            pipe.send(put_range(stub, rng, salt, range(start + (index - start) % writers, end, writers),
                                as_files, per_call))
        elif command == "lookups":
            pipe.send(lookup_loop(pipe, stub, rng, salt, *arguments))
        elif command == "disconnect":
            channel.close()
            pipe.send("closed")


class Writers:
    """--writers processes (spawned: gRPC does not survive a fork), each with its own channel."""

    def __init__(self, count, salt, as_files, per_call):
        self.as_files, self.per_call = as_files, per_call
        context = multiprocessing.get_context("spawn")
        self.pipes, self.processes = [], []
        for index in range(count):
            ours, theirs = context.Pipe()
            self.processes.append(context.Process(target=writer, args=(theirs, index, count, salt),
                                                  daemon=True))
            self.processes[-1].start()
            self.pipes.append(ours)

    def answer(self, index, limit):
        deadline = time.monotonic() + limit
        while not self.pipes[index].poll(1):
            if not self.processes[index].is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"writer {index} died or stopped answering")
        return self.pipes[index].recv()

    def tell_all(self, command, limit):
        for pipe in self.pipes:
            pipe.send(command)
        return [self.answer(index, limit) for index in range(len(self.pipes))]

    def connect(self, socket):
        self.tell_all(("connect", str(socket)), START_LIMIT + 10)

    def disconnect(self):
        self.tell_all(("disconnect",), 30)

    def fill(self, start, end):
        """Puts entries start..end-1 across the writers: (seconds, stored, failed, first error)."""
        began = time.perf_counter()
        answers = self.tell_all(("put", start, end, self.as_files, self.per_call), FILL_LIMIT + CALL_TIMEOUT + 60)
        seconds = time.perf_counter() - began
        errors = [error for _, _, error in answers if error]
        return (seconds, sum(a[0] for a in answers), sum(a[1] for a in answers),
                errors[0] if errors else None)

    def start_lookups(self, low, high):
        self.pipes[0].send(("lookups", low, high))

    def stop_lookups(self):
        self.pipes[0].send(("stop",))
        return self.answer(0, CALL_TIMEOUT + 30)

    def close(self):
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(5)


class Kilnd:
    """The bench's kilnd: its own data dir, socket, config and logs under `work`."""

    def __init__(self, work, bin_dir):
        self.kiln = bin_dir / "kiln"
        self.kilnd = bin_dir / "kilnd"
        self.data = work / "data"
        self.socket = work / "kilnd.sock"
        self.config = work / "kilnd.conf"
        self.logs = work / "logs"
        self.output = work / "kilnd.out"
        self.process = self.channel = self.stub = None

    def start(self, max_cache_size):
        """Starts kilnd; returns the seconds until it answered Health with SERVING."""
        self.config.write_text(f"max_cache_size = {max_cache_size}\nlog_dir = {self.logs}\n"
                               "log_level = info\nendpoint_file = none\n")
        began = time.perf_counter()
        with open(self.output, "a") as output:
            self.process = subprocess.Popen(
                [str(self.kilnd), f"--config={self.config}", f"--data-dir={self.data}",
                 f"--local-socket={self.socket}"], stdout=output, stderr=subprocess.STDOUT)
        self.channel = grpc.insecure_channel(f"unix:{self.socket}", options=CHANNEL_OPTIONS)
        health = self.channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda _: b"",
                                          response_deserializer=bytes)
        deadline = time.monotonic() + START_LIMIT
        while True:
            try:
                if health(None, timeout=0.5, wait_for_ready=True) == HEALTH_SERVING:
                    break
            except grpc.RpcError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"kilnd did not become healthy:\n{self.output.read_text()[-3000:]}")
            time.sleep(0.005)
        self.stub = _api.KilnStub(self.channel)
        return time.perf_counter() - began

    def stop(self):
        """SIGTERM; the seconds until kilnd exited, or None when it was killed after STOP_LIMIT."""
        if self.channel is not None:
            self.channel.close()
            self.channel = self.stub = None
        if self.process is None or self.process.poll() is not None:
            return 0.0
        began = time.perf_counter()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_LIMIT)
            return time.perf_counter() - began
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None

    def stats(self):
        return self.stub.GetStats(_api.GetStatsRequest(), timeout=STATS_TIMEOUT)

    def rss_mib(self):
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self):
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def log_text(self):
        return "".join(path.read_text(errors="replace") for path in sorted(self.logs.glob("*"))
                       if path.is_file())

    def kiln_stats_seconds(self):
        began = time.perf_counter()
        subprocess.run([str(self.kiln), "--endpoint", f"unix:{self.socket}", "--no-autostart", "stats"],
                       check=True, stdout=subprocess.DEVNULL, timeout=STATS_TIMEOUT)
        return time.perf_counter() - began


def filesystem_of(path):
    """The type and mount options of the file system holding `path` (what an
    unlink costs depends on them: discard, a journal)."""
    mount, kind, options = "", "?", "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if (str(path) + "/").startswith(fields[1].rstrip("/") + "/") and len(fields[1]) >= len(mount):
            mount, kind, options = fields[1], fields[2], fields[3]
    return f"{kind} ({options})"


def du_bytes(path):
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) * 1024


def count_paths(path):
    """Files, directories and links under `path` (links not followed)."""
    count = 0
    with os.scandir(path) as entries:
        for entry in entries:
            count += 1
            if entry.is_dir(follow_symlinks=False):
                count += count_paths(entry.path)
    return count


def lookup_latencies(stub, keys):
    """(ms of each lookup, how many found)."""
    times, found = [], 0
    for key in keys:
        ms, hit = timed_lookup(stub, key)
        times.append(ms)
        found += hit
    return times, found


def seconds_until_idle(kilnd, limit):
    """Seconds until kilnd used under 5% of a core for 0.5 s (at most `limit`)."""
    began = time.monotonic()
    while time.monotonic() - began < limit:
        cpu_before = kilnd.cpu_seconds()
        time.sleep(0.5)
        if kilnd.cpu_seconds() - cpu_before < 0.05 * 0.5:
            return time.monotonic() - began - 0.5
    return limit


def disk_ratio_settled(kilnd):
    """disk_bytes / du once both stopped changing while kilnd idled (its startup
    sweep measures the served files only at its end): (ratio, settled)."""
    previous = None
    deadline = time.monotonic() + SETTLE_LIMIT
    while True:
        cpu_before = kilnd.cpu_seconds()
        time.sleep(2)
        idle = kilnd.cpu_seconds() - cpu_before < 0.05 * 2
        reading = (kilnd.stats().disk_bytes, du_bytes(kilnd.data))
        if (idle and reading == previous) or time.monotonic() > deadline:
            return reading[0] / reading[1], idle and reading == previous
        previous = reading


def bare_sqlite(path, bounds, salt, rows_per_commit):
    """Bare SQLite's inserts in the segments `bounds` (rows/s of each), a
    commit per `rows_per_commit` rows, and its deletes of the oldest half (deletes/s)."""
    rng = random.Random()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # before the first table, as kilnd's VACUUM makes it
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE entries (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, data BLOB NOT NULL)")
    insert_rates = []
    for start, end in bounds:
        began = time.perf_counter()
        for first in range(start, end, rows_per_commit):
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT INTO entries (key, data) VALUES (?, ?)",
                           ((key_of(salt, index), blob_bytes(rng))
                            for index in range(first, min(end, first + rows_per_commit))))
            db.execute("COMMIT")
        insert_rates.append((end - start) / (time.perf_counter() - began))
    to_delete = bounds[-1][1] // 2
    began = time.perf_counter()
    for first in range(0, to_delete, BARE_DELETES_PER_TRANSACTION):
        db.execute("BEGIN IMMEDIATE")
        db.execute("DELETE FROM entries WHERE id IN (SELECT id FROM entries ORDER BY id LIMIT ?)",
                   (min(BARE_DELETES_PER_TRANSACTION, to_delete - first),))
        db.execute("COMMIT")
        db.execute("PRAGMA incremental_vacuum")
    delete_rate = to_delete / (time.perf_counter() - began)
    db.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return insert_rates, delete_rate


def fmt_seconds(seconds):
    if seconds is None:
        return f">{STOP_LIMIT} s"
    return "n/a" if seconds != seconds else f"{seconds:.2f}"  # nan: nothing was measured


HEADER = (f"{'entries':>9} {'put/s':>7} {'bare/s':>7} {'put/bare':>8} {'cpu/put':>7} {'busy':>5} "
          f"{'hit p50/p99':>12} "
          f"{'miss p50/p99':>12} {'RSS':>6} {'du MiB':>8} {'files/ent':>9} {'stats':>6} {'stop':>6} "
          f"{'start':>6} {'disk/du 1s':>10} {'settled':>8}")


def measure_size(kilnd, writers, salts, start, end, bare_rate):
    """Fills start..end-1, measures, restarts kilnd; prints the size's row and returns its numbers."""
    salt, absent_salt = salts
    writers.connect(kilnd.socket)
    cpu_before = kilnd.cpu_seconds()
    seconds, stored, failed, error = writers.fill(start, end)
    cpu_per_put_ms = (kilnd.cpu_seconds() - cpu_before) / max(stored, 1) * 1e3
    writers.disconnect()
    put_rate = stored / seconds
    busy_seconds = seconds_until_idle(kilnd, SETTLE_LIMIT)
    hits, hits_found = lookup_latencies(kilnd.stub, [key_of(salt, random.randrange(end))
                                                     for _ in range(LOOKUPS)])
    misses, misses_found = lookup_latencies(kilnd.stub, [key_of(absent_salt, random.randrange(1 << 62))
                                                         for _ in range(LOOKUPS)])
    rss = kilnd.rss_mib()
    entries = kilnd.stats().entries
    du = du_bytes(kilnd.data)
    files_per_entry = count_paths(kilnd.data) / max(entries, 1)
    stats_seconds = kilnd.kiln_stats_seconds()
    stop_seconds = kilnd.stop()
    start_seconds = kilnd.start(FILL_CAP)
    time.sleep(1)
    ratio_at_1s = kilnd.stats().disk_bytes / du_bytes(kilnd.data)
    ratio_settled, settled = disk_ratio_settled(kilnd)
    print(f"{entries:>9} {put_rate:>7.0f} {bare_rate:>7.0f} {put_rate / bare_rate:>7.2f}x "
          f"{cpu_per_put_ms:>7.2f} {busy_seconds:>5.1f} "
          f"{percentile(hits, .5):>5.2f}/{percentile(hits, .99):<6.2f} "
          f"{percentile(misses, .5):>5.2f}/{percentile(misses, .99):<6.2f} {rss:>6.0f} {du / 2**20:>8.1f} "
          f"{files_per_entry:>9.2f} {stats_seconds:>6.2f} {fmt_seconds(stop_seconds):>6} "
          f"{start_seconds:>6.2f} {ratio_at_1s:>10.3f} {ratio_settled:>7.3f}{'' if settled else '~'}",
          flush=True)
    if failed or hits_found != LOOKUPS or misses_found:
        print(f"{'':>9} ({failed} puts failed{': ' + error if error else ''}; {LOOKUPS - hits_found} of "
              f"{LOOKUPS} stored keys missed; {misses_found} absent keys found)", flush=True)
    return {"put_rate": put_rate, "hit_p99": percentile(hits, .99), "rss": rss, "files": files_per_entry,
            "stop": stop_seconds, "start": start_seconds, "ratio_1s": ratio_at_1s,
            "ratio_settled": ratio_settled}


def poll_stats(kilnd, began, until, timeout):
    """GetStats every POLL_SECONDS until `until(polls)` holds, `timeout`
    seconds since `began` (time.monotonic()) passed, or GetStats failed.
    Returns the polls, [(seconds since `began` when it answered, stats,
    seconds the call took)]."""
    polls = []
    while True:
        sent = time.monotonic()
        try:
            stats = kilnd.stats()
        except grpc.RpcError as error:
            print(f"  GetStats failed after {time.monotonic() - sent:.1f} s: {error.code().name}")
            return polls
        polls.append((time.monotonic() - began, stats, time.monotonic() - sent))
        if until(polls) or polls[-1][0] > timeout:
            return polls
        time.sleep(POLL_SECONDS)


def watch_eviction(kilnd, cap, timeout):
    """Polls while kilnd evicts to `cap`: (entries before, polls, whether it began)."""
    began = time.monotonic()
    full = kilnd.stats().entries
    # kilnd looks at its size after its startup sweep (which measures the served
    # files: disk_bytes reads low until then) and a maintenance interval. The
    # entry count says when it began: the eviction counter lags it by batches.
    polls = poll_stats(kilnd, began, lambda p: p[-1][1].entries < full, min(timeout, START_LIMIT))
    if polls[-1][1].entries == full:
        return began, full, polls, False
    polls += poll_stats(kilnd, began, lambda p: p[-1][1].disk_bytes <= cap, timeout)
    # It goes on below the cap (to 90% of it): until the count stops moving for 1 s.
    polls += poll_stats(kilnd, began, lambda p: len(p) > 2 and p[-1][1].entries == p[-3][1].entries,
                        timeout)
    return began, full, polls, True


def measure_eviction(kilnd, writers, entries_filled, bare_delete_rate, timeout, looked_up=None):
    """Restarts kilnd with max_cache_size at half the du; prints what its
    eviction does: alone, as bare SQLite deletes (looked_up None), or while
    one client looks up the newest `looked_up` of the entries filled in a loop."""
    kilnd.stop()
    du_full = du_bytes(kilnd.data)
    cap = du_full // 2
    start_seconds = kilnd.start(cap)
    if looked_up is not None:
        writers.connect(kilnd.socket)
        writers.start_lookups(int(entries_filled * (1 - looked_up)), entries_filled)
    began, full, polls, began_evicting = watch_eviction(kilnd, cap, timeout)
    hits, misses, failed = [], 0, 0
    if looked_up is not None:
        hits, misses, failed = writers.stop_lookups()
        writers.disconnect()
    # From the last poll that saw no entry gone (conservative by up to a poll)
    # to the first that saw disk_bytes <= cap.
    window_start = max(t for t, s, _ in polls if s.entries == full)
    under_cap = [(t, s) for t, s, _ in polls if t > window_start and s.disk_bytes <= cap]
    window_end, at_end = under_cap[0] if under_cap else polls[-1][:2]
    rate = (full - at_end.entries) / max(window_end - window_start, 1e-9)
    final = polls[-1][1]
    evicting_until = min(t for t, s, _ in polls if s.entries == final.entries)
    hits_ms = [ms for sent, ms in hits if window_start <= sent - began <= evicting_until]
    slowest_stats = max((took for t, _, took in polls if window_start < t <= evicting_until), default=0.0)
    du_after = du_bytes(kilnd.data)
    first_gone = min((t for t, s, _ in polls if s.entries < full), default=float("nan"))
    beside = "alone" if looked_up is None else f"beside a client looking up the newest {looked_up:.0%} in a loop"
    print(f"eviction, {beside}: restarted with max_cache_size {cap / 2**20:.1f} MiB (half of du "
          f"{du_full / 2**20:.1f} MiB), healthy in {start_seconds:.2f} s; entries began to go "
          f"{window_start:.1f}-{first_gone:.1f} s after")
    if not began_evicting:
        print(f"  kilnd did not begin evicting within {min(timeout, START_LIMIT):.0f} s: its disk_bytes / "
              f"cap {final.disk_bytes / cap:.3f}, du / cap {du_after / cap:.3f}")
    print(f"  freed {full - at_end.entries} entries in {window_end - window_start:.1f} s until disk_bytes "
          f"<= cap{'' if under_cap else f' (NOT reached in {timeout:.0f} s)'}: {rate:.0f} entries/s, "
          f"{rate / bare_delete_rate:.2f}x bare delete ({bare_delete_rate:.0f}/s)")
    print(f"  stopped at {final.entries} of {full} entries {evicting_until:.1f} s after the start; "
          f"disk_bytes / cap {final.disk_bytes / cap:.3f}, du / cap {du_after / cap:.3f}, "
          f"disk_bytes / du {final.disk_bytes / du_after:.3f}")
    if looked_up is not None:
        print(f"  while it evicted: {len(hits_ms)} hit lookups, p50 {percentile(hits_ms, .5):.2f} ms, p99 "
              f"{percentile(hits_ms, .99):.2f} ms, max {max(hits_ms, default=float('nan')):.1f} ms "
              f"({misses} misses, {failed} failed calls)")
    print(f"  GetStats took up to {slowest_stats:.2f} s meanwhile", flush=True)
    return {"rate": rate, "under_cap": bool(under_cap), "hit_p99": percentile(hits_ms, .99),
            "du_cap": du_after / cap}


def measure_stop_mid_eviction(kilnd):
    """Restarts kilnd with a cap of a sixteenth of the du and SIGTERMs it 2 s
    after its entry count first fell; prints how long it takes to exit.
    Returns (seconds, or None when killed, or nan when it never evicted;
    whether it was still evicting at the signal)."""
    kilnd.stop()
    cap = du_bytes(kilnd.data) // 16
    evictions_logged = kilnd.log_text().count(EVICTION_DONE_LOG)
    kilnd.start(cap)
    began = time.monotonic()
    full = kilnd.stats().entries
    while (now := kilnd.stats().entries) == full:
        if time.monotonic() - began > START_LIMIT:
            print(f"SIGTERM mid-eviction: kilnd did not begin evicting within {START_LIMIT} s at a cap of "
                  f"{cap / 2**20:.1f} MiB")
            return float("nan"), False
        time.sleep(0.1)
    waited = time.monotonic() - began
    time.sleep(2)
    # Not GetStats: it waits for the eviction's batches. kilnd logs an eviction's end.
    evicting = kilnd.log_text().count(EVICTION_DONE_LOG) == evictions_logged
    stop_seconds = kilnd.stop()
    print(f"SIGTERM mid-eviction: cap {cap / 2**20:.1f} MiB; entries began to go {waited:.1f} s after "
          f"healthy ({full - now} gone by then); signal 2 s later, "
          f"{'still evicting' if evicting else 'eviction already over'}; exit took "
          f"{fmt_seconds(stop_seconds)} s{' (killed)' if stop_seconds is None else ''}", flush=True)
    return stop_seconds, evicting


def measure_stops_mid_eviction(kilnd, full_copy, delays):
    """For each of `delays`: the store as the fill left it (`full_copy`) back
    in place, kilnd restarted with a cap of a sixteenth of its du, and SIGTERM
    that many seconds after its entry count first fell. Returns, per delay,
    (seconds to exit, or None when killed; whether it was still evicting)."""
    results = []
    for delay in delays:
        kilnd.stop()
        shutil.rmtree(kilnd.data)
        shutil.copytree(full_copy, kilnd.data, symlinks=True)
        cap = du_bytes(kilnd.data) // 16
        evictions_logged = kilnd.log_text().count(EVICTION_DONE_LOG)
        kilnd.start(cap)
        began = time.monotonic()
        full = kilnd.stats().entries
        while kilnd.stats().entries == full and time.monotonic() - began < START_LIMIT:
            time.sleep(0.05)
        time.sleep(delay)
        evicting = kilnd.log_text().count(EVICTION_DONE_LOG) == evictions_logged
        stop_seconds = kilnd.stop()
        results.append((stop_seconds, evicting))
        print(f"SIGTERM {delay:g} s into an eviction of {full} entries to a cap of {cap / 2**20:.1f} MiB: "
              f"{'still evicting' if evicting else 'eviction already over'}; exit took "
              f"{fmt_seconds(stop_seconds)} s{' (killed)' if stop_seconds is None else ''}", flush=True)
    return results


def check(label, value, ok):
    print(f"  {'ok  ' if ok else 'MISS'} {label}: {value}")


def report_targets(last_size, rows, bare_rates, eviction, mid_eviction):
    last, (bare_insert, bare_delete) = rows[-1], bare_rates
    stop_mid, was_evicting = mid_eviction
    print(f"put / bare insert {last['put_rate'] / bare_insert:.2f}x; eviction / bare delete "
          f"{eviction['rate'] / bare_delete:.2f}x")
    print(f"against issue 53's targets (set for 1M entries; this run's last size is {last_size}):")
    check("put >= 1500/s and >= 0.5x bare",
          f"{last['put_rate']:.0f}/s, {last['put_rate'] / bare_insert:.2f}x",
          last["put_rate"] >= max(1500, 0.5 * bare_insert))
    check("eviction >= 5000/s and >= 0.5x bare delete",
          f"{eviction['rate']:.0f}/s, {eviction['rate'] / bare_delete:.2f}x",
          eviction["under_cap"] and eviction["rate"] >= max(5000, 0.5 * bare_delete))
    check("hit p99 <= 2 ms", f"{last['hit_p99']:.2f} ms", last["hit_p99"] <= 2)
    check("hit p99 <= 2 ms during eviction", f"{eviction['hit_p99']:.2f} ms", eviction["hit_p99"] <= 2)
    stops = [row["stop"] for row in rows]
    check("SIGTERM <= 2 s, idle", ", ".join(fmt_seconds(s) for s in stops),
          all(s is not None and s <= 2 for s in stops))
    check("SIGTERM <= 2 s, mid-eviction", fmt_seconds(stop_mid)
          + ("" if was_evicting else " (the eviction was over at the signal: not measured)"),
          was_evicting and stop_mid is not None and stop_mid <= 2)
    check("du <= 1.05x cap after eviction", f"{eviction['du_cap']:.3f}x", eviction["du_cap"] <= 1.05)
    check("disk_bytes within 5% of du (1 s after restart, settled)",
          f"{last['ratio_1s']:.3f}, {last['ratio_settled']:.3f}",
          abs(last["ratio_1s"] - 1) <= 0.05 and abs(last["ratio_settled"] - 1) <= 0.05)
    check("restart <= 2 s", f"{last['start']:.2f} s", last["start"] <= 2)
    check("RSS <= 256 MiB", f"{last['rss']:.0f} MiB", last["rss"] <= 256)
    check("<= 1.2 files per entry", f"{last['files']:.2f}", last["files"] <= 1.2)


def report_log(kilnd):
    """kilnd's warnings and errors over the run (its log files and its output)."""
    text = kilnd.log_text() + (kilnd.output.read_text(errors="replace") if kilnd.output.exists() else "")
    lines = [line for line in text.splitlines()
             if "[warning]" in line or "[error]" in line or "[critical]" in line]
    print(f"kilnd logged {len(lines)} warnings and errors" + (":" if lines else ""))
    for line in list(dict.fromkeys(lines))[:20]:  # each distinct line once
        print(f"  {line[:300]}")


def copy_binaries(build_dir, bin_dir):
    """Copies kilnd, its worker script and the kiln CLI (the build dir may be
    rebuilt meanwhile); returns which kilnd it is: its digest and build time."""
    bin_dir.mkdir()
    for name in ("service/kilnd", "service/kiln_worker.py", "client/cpp/kiln"):
        if not (build_dir / name).exists():
            sys.exit(f"{build_dir / name} is missing: build Kiln first (cmake --build {build_dir})")
        shutil.copy2(build_dir / name, bin_dir)
    digest = hashlib.sha256((bin_dir / "kilnd").read_bytes()).hexdigest()[:12]
    built = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((bin_dir / "kilnd").stat().st_mtime))
    return f"kilnd {digest} (built {built}) from {build_dir}"


def run(args, work):
    sizes = args.sizes
    bounds = list(zip([0, *sizes[:-1]], sizes))
    salts = (os.urandom(16), os.urandom(16))  # stored keys, absent keys
    kilnd = Kilnd(work, work / "bin")
    writers = None
    try:
        print(copy_binaries(args.build_dir.resolve(), work / "bin"))
        print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {args.writers} writers, "
              f"{args.per_call} entries a call ({'Put' if args.per_call == 1 else 'PutMany'}); entries of one "
              f"blob of {BLOB_SIZES[0]}-{BLOB_SIZES[1]} random bytes; data dir {kilnd.data} on "
              f"{filesystem_of(work)}; SQLite {sqlite3.sqlite_version} for bare", flush=True)
        # A group commit's best: one commit for a call of each writer.
        rows_per_commit = args.writers * args.per_call
        insert_rates, bare_delete_rate = bare_sqlite(work / "bare.db", bounds, salts[0], rows_per_commit)
        print(f"bare SQLite: inserts/s by segment {', '.join(f'{rate:.0f}' for rate in insert_rates)} "
              f"({rows_per_commit} rows a commit); deleted {sizes[-1] // 2} at {bare_delete_rate:.0f}/s "
              f"({BARE_DELETES_PER_TRANSACTION} a transaction + incremental_vacuum)", flush=True)
        writers = Writers(args.writers, salts[0], args.as_files, args.per_call)
        kilnd.start(FILL_CAP)
        print("hit, miss: ms; RSS, du: MiB; cpu/put: kilnd's ms; busy, stats, stop, start: s; "
              f"~: not settled in {SETTLE_LIMIT} s")
        print(HEADER, flush=True)
        rows = [measure_size(kilnd, writers, salts, start, end, rate)
                for (start, end), rate in zip(bounds, insert_rates)]
        full_copy = work / "data.full"
        if args.stops_mid_eviction:
            kilnd.stop()
            shutil.copytree(kilnd.data, full_copy, symlinks=True)
            kilnd.start(FILL_CAP)
        # Its rate alone, as bare SQLite's deletes run (a client's lookup loop
        # takes more than a core of two, and eviction yields to lookups); then
        # the lookups' latency during a second eviction, which keeps the newest
        # 10% (it goes down to 90% of half of what the first left, some 20%).
        eviction = measure_eviction(kilnd, writers, sizes[-1], bare_delete_rate, args.evict_timeout)
        eviction["hit_p99"] = measure_eviction(kilnd, writers, sizes[-1], bare_delete_rate, args.evict_timeout,
                                               looked_up=0.1)["hit_p99"]
        mid_eviction = measure_stop_mid_eviction(kilnd)
        stops = measure_stops_mid_eviction(kilnd, full_copy, args.stops_mid_eviction)
        report_targets(sizes[-1], rows, (insert_rates[-1], bare_delete_rate), eviction, mid_eviction)
        if stops:
            timed = [seconds for seconds, evicting in stops if evicting]
            check(f"SIGTERM <= 2 s, {', '.join(f'{d:g}' for d in args.stops_mid_eviction)} s into an "
                  "eviction of the full store",
                  ", ".join(fmt_seconds(seconds) + ("" if evicting else " (over)") for seconds, evicting in stops),
                  bool(timed) and all(seconds is not None and seconds <= 2 for seconds in timed))
        report_log(kilnd)
        print(f"load at the end {os.getloadavg()[0]:.1f} (other processes share the CPUs and the disk)")
    finally:
        kilnd.stop()
        if writers is not None:
            writers.close()


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser(description="issue 53: kilnd's store at farm scale")
    parser.add_argument("--sizes", default="100000,300000,1000000",
                        type=lambda text: [int(size) for size in text.split(",")],
                        help="entry counts to fill up to, one after another (comma-separated)")
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--per-call", type=int, default=32,
                        help="entries a writer sends a call: PutMany, as bulk writers (kiln import) "
                             "do; 1: Put, as a client storing one compile's result does")
    parser.add_argument("--as-files", action="store_true",
                        help="puts of a client that reads entries as kilnd's served files (the Python client's)")
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build")
    parser.add_argument("--evict-timeout", type=float, default=600)
    parser.add_argument("--stops-mid-eviction", default=[],
                        type=lambda text: [float(delay) for delay in text.split(",")],
                        help="also SIGTERM kilnd these many seconds into an eviction of the store as "
                             "the fill left it (a copy put back each time), e.g. 1,3,6")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (data dir, kilnd's logs)")
    args = parser.parse_args()
    if args.sizes != sorted(set(args.sizes)) or args.sizes[0] <= 0:
        parser.error("--sizes: increasing entry counts, e.g. 2000,5000")
    # Everything started is stopped in the end, whatever happens, SIGTERM included.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("store_bench: terminated"))
    work = Path(tempfile.mkdtemp(prefix="kiln-store-bench-"))
    try:
        run(args, work)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

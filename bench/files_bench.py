"""Files and disk the kernel suite costs (issue 53: "The kernel suite through
the client: files per kernel <= stock Triton's"): stock Triton's cache dir
against everything Kiln writes for the same kernels, measured in one run on one
machine (no GPU needed). Each process is tests/python/client_probe.py suite
(kernel_suite.SUITE at sm80 and sm90: the kernel count it reports divides every
per-kernel number), with this python; all dirs are new, under one temp dir:

  stock          a process without Kiln, its own empty TRITON_CACHE_DIR
  kiln cold      a kilnd of the bench's own (its data dir and socket; its logs
                 in a dir outside the data dir, not counted) and a process with
                 KILN=1, KILN_STRICT=1 (a fallback to stock fails the bench),
                 its own empty TRITON_CACHE_DIR and KILN_FILES_DIR
  kiln warm      a second process with the same dirs and kilnd: the steady state
                 (a warm run may add files: served copies, links, index entries)

Counted in each location once kilnd's data dir has settled (unchanged for 1 s),
the location's own dir not included:

  files, dirs, links   regular files (and anything else neither a directory nor
                       a link), directories, symbolic links
  all, /kernel         their sum, and that per kernel
  du KiB, /kernel      du -sk of the location, and that per kernel

The locations: Triton's cache dir (client's, for Kiln), the client's files dir,
and kilnd's data dir split three ways: "db" is SQLite's database and its
-wal/-shm (a fixed number of files, whose size grows with the entries' inline
blobs); "fixed" is the rest of kilnd's own files, whatever the entry count
(lock, space reserve, the dirs that hold the fan-out dirs, a hit journal per
client process until kilnd collects it), plus "<socket>.files" beside the
socket, where local clients find the served files (in the data dir's du too);
"entries" is everything in the two-hex-digit fan-out dirs. The ratios
against stock (Kiln / stock) are given for all of Kiln, for Kiln without db
and fixed (what grows with the kernels: with a few dozen kernels a dozen fixed
files would otherwise weigh on the per-kernel number), and for the files and
links of that alone: Kiln's fan-out dirs are at most 256 under each of their
parents, so with a few kernels there is almost one per file and with
thousands they hardly count, where stock makes one dir per kernel whatever
the count. du is the locations' du -sk, for the data dir's parts the
allocated blocks of their files; stock's is its dir's. Then what each location
holds in the warm state, by pattern (hex names as *, fan-out dirs as hh,
Triton's keys as <key>), with the count per kernel.

usage: python bench/files_bench.py [--build-dir build] [--keep]
       (python: one with triton and the current kiln client installed; the
       header says where its client is from and whether it matches client/python)
"""

import argparse
import collections
import filecmp
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import hermetic  # noqa: E402  (tests/hermetic.py)

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "python" / "client_probe.py"
SETTLE_SECONDS = 1.0  # kilnd's data dir unchanged this long counts as settled
SETTLE_LIMIT = 30
DATABASE_FILES = re.compile(r"kiln\.db(-wal|-shm|-journal)?")
FAN_OUT = re.compile(r"[0-9a-f]{1,2}")  # kilnd's one hex digit, the client's own files' two
# Triton's keys (base32) and Kiln's content digests (hex) as file or dir names.
KEY_NAME = re.compile(r"[A-Z2-7]{32,}|[0-9a-f]{32,}")
STOCK_CACHE = "stock TRITON_CACHE_DIR"
KILND_DATA = "kilnd data dir"


class Tally:
    """What a set of paths holds: counts by kind and allocated bytes."""

    def __init__(self):
        self.counts = collections.Counter()  # "files" | "dirs" | "links" -> how many
        self.bytes = 0

    def add(self, path):
        stat = path.lstat()
        if path.is_symlink():
            self.counts["links"] += 1
        elif path.is_dir():
            self.counts["dirs"] += 1
        else:
            self.counts["files"] += 1
        self.bytes += stat.st_blocks * 512


def paths_under(root):
    """Every path under `root` (links not followed), `root` itself not included."""
    if not root.exists():
        return []
    return sorted(Path(directory, name) for directory, dirs, files in os.walk(root) for name in dirs + files)


def data_dir_part(relative):
    """Which part of kilnd's data dir a path is: "db", "entries" or "fixed"."""
    if DATABASE_FILES.fullmatch(relative.name) and len(relative.parts) == 1:
        return "db"
    return "entries" if any(FAN_OUT.fullmatch(part) for part in relative.parts) else "fixed"


def pattern_of(relative):
    """`relative` with the names that differ from entry to entry replaced."""
    parts = []
    for part in relative.parts:
        if FAN_OUT.fullmatch(part):
            parts.append("hh")
        elif KEY_NAME.fullmatch(part):
            parts.append("<key>")
        else:
            stem, dot, extension = part.partition(".")
            # A file of one entry (or of one process: a hit journal): its kind is what tells.
            if KEY_NAME.fullmatch(stem) or (parts and parts[-1] in ("hh", "<key>")):
                part = f"{'__grp__' if stem.startswith('__grp__') else ''}*{dot}{extension}"
            parts.append(part)
    return "/".join(parts)


def du_kib(root):
    if not root.exists():
        return 0
    output = subprocess.run(["du", "-sk", str(root)], capture_output=True, text=True, check=True).stdout
    return int(output.split()[0])


class Snapshot:
    """The locations' tallies, du and patterns at one moment; kilnd's data dir
    (named KILND_DATA) also by part, with the pointer file beside its socket as fixed."""

    def __init__(self, locations, pointer=None):
        self.tallies = {name: Tally() for name in locations}
        self.parts = {part: Tally() for part in ("db", "fixed", "entries")}
        self.du = {name: du_kib(root) for name, root in locations.items()}
        self.patterns = {name: collections.Counter() for name in locations}
        for name, root in locations.items():
            for path in paths_under(root):
                relative = path.relative_to(root)
                self.tallies[name].add(path)
                self.patterns[name][pattern_of(relative)] += 1
                if name == KILND_DATA:
                    self.parts[data_dir_part(relative)].add(path)
        if pointer is not None and pointer.exists():
            for tally in (self.tallies[KILND_DATA], self.parts["fixed"]):
                tally.add(pointer)
            self.du[KILND_DATA] += pointer.lstat().st_blocks // 2
            self.patterns[KILND_DATA][f"../{pointer.name} (beside the socket)"] += 1

    def key(self):
        return [(t.counts, t.bytes) for t in (*self.tallies.values(), *self.parts.values())], self.du


def settled_snapshot(locations, pointer):
    """A snapshot once kilnd stopped writing (its served files may follow an answer): (snapshot, settled)."""
    deadline = time.monotonic() + SETTLE_LIMIT
    snapshot = Snapshot(locations, pointer)
    while time.monotonic() < deadline:
        time.sleep(SETTLE_SECONDS)
        again = Snapshot(locations, pointer)
        if again.key() == snapshot.key():
            return again, True
        snapshot = again
    return snapshot, False


def run_probe(env):
    """Compiles the suite in a new process: how many kernels it compiled."""
    result = subprocess.run([sys.executable, str(PROBE), "suite"], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"client_probe.py suite failed:\n{result.stderr[-3000:]}")
    return len(json.loads(result.stdout.splitlines()[-1])["kernels"])


def copy_binaries(build_dir, bin_dir):
    """kilnd, its worker script and the kiln CLI, copied (the build dir may be rebuilt meanwhile)."""
    bin_dir.mkdir()
    for name in ("service/kilnd", "service/kiln_worker.py", "client/cpp/kiln"):
        if not (build_dir / name).exists():
            sys.exit(f"{build_dir / name} is missing: build Kiln first (cmake --build {build_dir})")
        shutil.copy2(build_dir / name, bin_dir)
    built = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((bin_dir / "kilnd").stat().st_mtime))
    return f"kilnd built {built} in {build_dir}"


def start_kilnd(bin_dir, work):
    socket = work / "kilnd.sock"
    process = subprocess.Popen([str(bin_dir / "kilnd"), f"--data-dir={work / 'kilnd-data'}",
                                f"--log-dir={work / 'kilnd-logs'}", f"--local-socket={socket}",
                                f"--toolchain={sys.executable}", "--log-level=warn"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([str(bin_dir / "kiln"), "--endpoint", f"unix:{socket}", "health", "--wait", "60"],
                   check=True, stdout=subprocess.DEVNULL)
    return process, socket


def client_origin():
    """Where this python's kiln client comes from, and whether it is client/python's."""
    import kiln
    import triton

    installed = Path(kiln.__file__).parent
    source = ROOT / "client" / "python" / "kiln"
    differing = [str(path.relative_to(source)) for path in source.rglob("*.py")
                 if not (installed / path.relative_to(source)).exists()
                 or not filecmp.cmp(path, installed / path.relative_to(source), shallow=False)]
    state = f"differs from client/python in {', '.join(differing)}" if differing else "matches client/python"
    return f"triton {triton.__version__}; kiln client {installed} ({state})"


COLUMNS = f"  {'':30}{'files':>7}{'dirs':>6}{'links':>6}{'all':>6}{'/kernel':>9}{'du KiB':>9}{'/kernel':>9}"


def row(label, counts, du_kib_of, kernels):
    everything = sum(counts.values())
    du_text = "" if du_kib_of is None else f"{du_kib_of:9d}{du_kib_of / kernels:9.1f}"
    print(f"  {label:30}{counts['files']:7d}{counts['dirs']:6d}{counts['links']:6d}{everything:6d}"
          f"{everything / kernels:9.2f}{du_text}")


def report_phase(phase, snapshot, settled, kernels, stock):
    print(f"{phase}{'' if settled else f' (kilnd data dir still changing after {SETTLE_LIMIT} s)'}")
    for name, tally in snapshot.tallies.items():
        row(name, tally.counts, snapshot.du[name], kernels)
        if name == KILND_DATA:
            for part, part_tally in snapshot.parts.items():
                row(f"  {part}", part_tally.counts, part_tally.bytes // 1024, kernels)
    total = sum((tally.counts for tally in snapshot.tallies.values()), collections.Counter())
    growing = total - snapshot.parts["db"].counts - snapshot.parts["fixed"].counts
    total_du = sum(snapshot.du.values())
    row("all of Kiln", total, total_du, kernels)
    row("  without db and fixed", growing, None, kernels)
    stock_counts = stock.tallies[STOCK_CACHE].counts
    stock_all = sum(stock_counts.values())
    print(f"  Kiln / stock: files+dirs+links {sum(total.values()) / stock_all:.2f}x, without db and fixed "
          f"{sum(growing.values()) / stock_all:.2f}x; du {total_du / stock.du[STOCK_CACHE]:.2f}x")
    print(f"  Kiln / stock: files+links without db and fixed "
          f"{files_and_links(growing) / files_and_links(stock_counts):.2f}x")


def files_and_links(counts):
    return counts["files"] + counts["links"]


def report_patterns(snapshot, kernels):
    for location, patterns in snapshot.patterns.items():
        print(f"  {location}{'' if patterns else ': empty'}")
        for pattern, count in sorted(patterns.items()):
            print(f"    {count:5d} {count / kernels:6.2f}/kernel  {pattern}")


def measure(bin_dir, work):
    base = hermetic.stock_env()
    stock_dir = work / "stock-triton-cache"
    kernels = run_probe(dict(base, TRITON_CACHE_DIR=str(stock_dir)))
    stock = Snapshot({STOCK_CACHE: stock_dir})
    kilnd, socket = start_kilnd(bin_dir, work)
    try:
        locations = {"client TRITON_CACHE_DIR": work / "client-triton-cache",
                     "client KILN_FILES_DIR": work / "client-files", KILND_DATA: work / "kilnd-data"}
        client = dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{socket}",
                      TRITON_CACHE_DIR=str(locations["client TRITON_CACHE_DIR"]),
                      KILN_FILES_DIR=str(locations["client KILN_FILES_DIR"]))
        phases = {}
        for phase in ("kiln cold", "kiln warm"):
            compiled = run_probe(client)
            if compiled != kernels:
                sys.exit(f"{phase}: the probe compiled {compiled} kernels, stock's {kernels}")
            phases[phase] = settled_snapshot(locations, Path(f"{socket}.files"))
    finally:
        kilnd.terminate()
        kilnd.wait()
    return kernels, stock, phases


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    parser = argparse.ArgumentParser(description="issue 53: files and disk per kernel, Kiln and stock Triton")
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (every location counted)")
    args = parser.parse_args()
    # The temp dir goes, and kilnd with it, whatever happens, SIGTERM included.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("files_bench: terminated"))
    work = Path(tempfile.mkdtemp(prefix="kiln-files-bench-"))
    try:
        print(copy_binaries(args.build_dir.resolve(), work / "bin"))
        print(client_origin())
        kernels, stock, phases = measure(work / "bin", work)
        print(f"{kernels} kernels (kernel_suite.SUITE at sm80 and sm90); every /kernel divides by {kernels}")
        print(COLUMNS)
        print("stock")
        row(STOCK_CACHE, stock.tallies[STOCK_CACHE].counts, stock.du[STOCK_CACHE], kernels)
        for phase, (snapshot, settled) in phases.items():
            report_phase(phase, snapshot, settled, kernels, stock)
        print("what each location holds, by pattern: stock, then kiln warm")
        report_patterns(stock, kernels)
        report_patterns(phases["kiln warm"][0], kernels)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

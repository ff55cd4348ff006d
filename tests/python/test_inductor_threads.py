"""A graph's Triton kernels compiled at once through kilnd where inductor
compiles them one after another (kiln/inductor/threads.py): real inductor
(.venv-torch) and a real kilnd, compile-only for sm90 (no GPU here:
inductor_kernels_program.py says what stands in). The kernels are stock's,
byte for byte, each compiled once, the frontend in Kiln's threads (or, with
KILN_INDUCTOR_IN_KILND=1, whole in kilnd's workers); a kernel that fails to
compile fails as in stock; KILN_INDUCTOR_AHEAD=0 and =pool."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import hermetic
import process_table
from conftest import BUILD, REPO, Kilnd

PYTHON = REPO / ".venv-torch" / "bin" / "python"
PROGRAM = REPO / "tests" / "python" / "inductor_kernels_program.py"
KERNELS = 6


@pytest.fixture
def kilnd(tmp_path):
    # Started from an environment with Kiln on, as the client starts one: its
    # workers must compile a kernel's module with stock Triton all the same.
    socket = tmp_path / "kilnd" / "kilnd.sock"
    server = Kilnd(tmp_path / "kilnd", f"--toolchain={PYTHON}", "--compile-workers=2",
                   env=dict(os.environ, KILN="1", KILN_ENDPOINT=f"unix:{socket}"))
    yield server
    assert server.stop() == 0, (server.root / "kilnd.out").read_text()


def run(tmp_path, name, *flags, kilnd=None, **settings):
    env = hermetic.stock_env("TORCHINDUCTOR_")
    # One directory of kernel modules for all: a cubin's line info names its module's file.
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), TRITON_CACHE_DIR=str(tmp_path / name / "triton"),
               KILN_FILES_DIR=str(tmp_path / name / "kiln-files"), **settings)
    if kilnd is not None:
        env.update(KILN="1", KILN_STRICT="1", KILN_DEBUG="1", KILN_ENDPOINT=f"unix:{kilnd.socket}")
    done = subprocess.run([str(PYTHON), str(PROGRAM), *flags], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_a_graphs_kernels_compile_at_once_through_kilnd_into_stocks_kernels(tmp_path, kilnd):
    stock, _ = run(tmp_path, "stock", str(KERNELS), "1")
    assert "error" not in stock, stock
    assert stock["returned"] == "CachingAutotuner" and stock["compile_threads"] == ["MainThread"]
    assert len(stock["cubins"]) == KERNELS

    compiled, log = run(tmp_path, "kiln", str(KERNELS), "1", kilnd=kilnd)
    assert "error" not in compiled, compiled
    # The module got futures, every config compiled in Kiln's threads, and wait
    # handed it kernels holding every config: stock's cubins, each compiled once.
    assert compiled["returned"] == "_Compiling"
    assert compiled["compile_threads"] == ["kiln-compile"], compiled["compile_threads"]
    assert compiled["configs_compiled"] == stock["configs_compiled"]
    assert compiled["cubins"] == stock["cubins"]
    assert f"{KERNELS} kernels of a graph compiled at once" in log, log[-3000:]
    configs = sum(stock["configs_compiled"].values())
    stats = kilnd.stats()
    # The frontends ran here, the rest in kilnd's workers.
    assert stats.compiles == configs and rpc_calls(stats, "CompileInductorKernel") == (0, 0)
    # The process reported them as it exited: a compile ahead per kernel. The
    # time they saved depends on the machine's load (none with no core free);
    # what it adds up from, test_compile_threads.
    assert stats.compiled_ahead == KERNELS


def rpc_calls(stats, method):
    """(calls, errors) of one RPC, as kilnd counts them."""
    return next(((rpc.count, rpc.errors) for rpc in stats.rpc_latency if rpc.method == method), (0, 0))


def test_with_kiln_inductor_in_kilnd_1_each_kernel_compiles_whole_in_kilnds_workers(tmp_path, kilnd):
    stock, _ = run(tmp_path, "stock", "3", "6")
    compiled, _ = run(tmp_path, "kiln", "3", "6", kilnd=kilnd, KILN_INDUCTOR_IN_KILND="1")
    assert compiled["returned"] == "_Compiling" and compiled["configs_compiled"] == stock["configs_compiled"]
    assert compiled["cubins"] == stock["cubins"]
    # Each kernel's module was compiled whole in kilnd's workers, which stored
    # every config's kernel under the key this process looks up (its Triton
    # remembers another ptxas than the one that compiles: inductor_kernels_program.py):
    # the process's own compiles all hit, and sent kilnd nothing to compile.
    stats = kilnd.stats()
    assert rpc_calls(stats, "CompileInductorKernel") == (3, 0)
    assert stats.compiles == 0 and stats.hits == sum(stock["configs_compiled"].values()), stats
    # One process imported torch for every module, the fork server a worker
    # started (kiln_worker.py); its children, one per worker, ran them: no
    # worker has torch loaded.
    parents = {pid: process.parent for pid, process in process_table.running().items()}
    with_torch = [pid for pid in kilnd.descendant_pids() if torch_loaded(pid)]
    workers = kilnd.worker_pids()
    (server, ) = [pid for pid in with_torch if parents[pid] in workers]
    children = [pid for pid in with_torch if pid != server]
    assert children and all(parents[pid] == server for pid in children), (server, children, workers)
    assert not set(with_torch) & set(workers)


def torch_loaded(pid):
    try:
        return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # it ended meanwhile
        return False


@pytest.mark.parametrize("in_kilnd", ["0", "1"])
def test_a_kernel_that_fails_to_compile_fails_as_in_stock(tmp_path, kilnd, in_kilnd):
    stock, _ = run(tmp_path, "stock", "3", "2", "--failing")
    assert stock["error"].startswith("CompilationError"), stock
    through_kiln, _ = run(tmp_path, "kiln", "3", "2", "--failing", kilnd=kilnd, KILN_INDUCTOR_IN_KILND=in_kilnd)
    assert through_kiln["error"] == stock["error"]
    # The two kernels that compile were compiled ahead all the same.
    assert "kiln-compile" in through_kiln["compile_threads"]
    if in_kilnd == "1":  # the failing one failed in kilnd's worker too, and was compiled here again
        assert rpc_calls(kilnd.stats(), "CompileInductorKernel") == (3, 0)


def test_a_kernel_module_that_hangs_in_kilnd_is_killed_at_the_timeout_and_compiled_here(tmp_path):
    # The job runs in a child of the fork server, which holds the worker's
    # stderr: killed with its worker, or kilnd would wait on it for an hour.
    # The other kernel's job starts the fork server (imports torch) and
    # compiles within the timeout: about 5 s on 2 cores.
    server = Kilnd(tmp_path / "kilnd", f"--toolchain={PYTHON}", "--compile-workers=2", "--compile-timeout-seconds=20")
    try:
        stock, _ = run(tmp_path, "stock", "2", "9", "--hanging-in-kilnd")
        compiled, _ = run(tmp_path, "kiln", "2", "9", "--hanging-in-kilnd", kilnd=server, KILN_INDUCTOR_IN_KILND="1")
        assert compiled["cubins"] == stock["cubins"]
        # One kernel's configs came whole from kilnd's workers; the other's
        # frontends ran here after its job was killed, the rest in kilnd.
        stats = server.stats()
        assert rpc_calls(stats, "CompileInductorKernel") == (2, 0), stats
        assert stats.hits == stock["configs_compiled"]["triton_poi_fused_mul_tanh_0"], stats
        assert stats.compiles == stock["configs_compiled"]["triton_poi_fused_mul_tanh_1"], stats
    finally:
        assert server.stop() == 0, (server.root / "kilnd.out").read_text()[-3000:]


def test_kiln_inductor_ahead_0_leaves_the_compile_to_inductor(tmp_path, kilnd):
    serial, _ = run(tmp_path, "serial", "2", "3", kilnd=kilnd, KILN_INDUCTOR_AHEAD="0")
    assert serial["returned"] == "CachingAutotuner" and serial["compile_threads"] == ["MainThread"]


def test_where_inductors_pool_is_not_up_kilns_threads_compile(tmp_path, kilnd):
    # Two compile threads: stock would start inductor's pool of compile
    # processes, and compile in the calling thread until it is up. Kiln holds
    # the pool back outside a graph's compile (_inductor_pool), so its threads
    # compile; with KILN_INDUCTOR_AHEAD=pool they take the pool's place always.
    stock, _ = run(tmp_path, "stock", "2", "4", "--compile-threads", "2")
    assert stock["returned"] == "CachingAutotuner" and stock["compile_threads"] == ["MainThread"]
    default, _ = run(tmp_path, "default", "2", "4", "--compile-threads", "2", kilnd=kilnd)
    assert default["returned"] == "_Compiling" and default["compile_threads"] == ["kiln-compile"]
    assert default["cubins"] == stock["cubins"]
    in_place, _ = run(tmp_path, "pool", "2", "5", "--compile-threads", "2", kilnd=kilnd, KILN_INDUCTOR_AHEAD="pool")
    assert in_place["returned"] == "_Compiling" and in_place["compile_threads"] == ["kiln-compile"]
    assert not default["pool_started"] and not in_place["pool_started"]


SQUATTER = """
import os, socket, sys
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1].encode("latin-1").replace(b"@", b"\\0", 1))
listener.listen(16)
print("listening", flush=True)
while True:
    connection, _ = listener.accept()
    print(len(connection.recv(1 << 20)), flush=True)
    connection.close()
"""


def fork_server_addresses(kilnd):
    """The abstract socket names (as /proc/net/unix writes them, "@...") of
    fork servers for this kilnd's workers."""
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return {line.split()[-1] for line in lines
            if len(line.split()) == 8 and line.split()[-1].startswith("@kiln-inductor-")
            and f"-{kilnd.process.pid}-" in line.split()[-1]}


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another account needs root")
def test_a_fork_server_address_another_account_holds_is_sent_no_module(tmp_path, kilnd):
    run(tmp_path, "first", "2", "7", kilnd=kilnd, KILN_INDUCTOR_IN_KILND="1")
    (address, ) = fork_server_addresses(kilnd)
    # Another account takes the address once the fork server has ended.
    # The server and its children, which hold the workers' connections.
    for pid in [pid for pid in kilnd.descendant_pids() if torch_loaded(pid)]:
        os.kill(pid, signal.SIGKILL)
    while fork_server_addresses(kilnd):
        time.sleep(0.05)
    # The system's Python: the account cannot read the test's own.
    squatter = subprocess.Popen(["/usr/bin/python3", "-c", SQUATTER, address], user=65534,
                                stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline() == "listening\n"
        stock, _ = run(tmp_path, "stock", "2", "8")
        compiled, _ = run(tmp_path, "second", "2", "8", kilnd=kilnd, KILN_INDUCTOR_IN_KILND="1")
    finally:
        squatter.kill()
        received = squatter.communicate()[0].split()
    # The workers met the other account's socket, sent it nothing, and
    # compiled the modules themselves: every config was kilnd's all the same.
    assert received and set(received) == {"0"}, received
    assert compiled["cubins"] == stock["cubins"]
    stats = kilnd.stats()
    assert rpc_calls(stats, "CompileInductorKernel") == (4, 0) and stats.compiles == 0, stats


def strangers_import(tmp_path, kilnd, kernels):
    """A fresh kilnd of the same toolchain that imported what `kilnd` holds,
    exported unsigned, compiling every one of its `kernels` and refusing
    none; the caller stops it."""
    bundle = tmp_path / "unsigned.kilnbundle"
    kiln = [str(BUILD / "client" / "cpp" / "kiln"), "--endpoint"]
    exported = subprocess.run([*kiln, f"unix:{kilnd.socket}", "export", str(bundle)], capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr
    stranger = Kilnd(tmp_path / "stranger", f"--toolchain={PYTHON}", "--compile-workers=2")
    imported = subprocess.run([*kiln, f"unix:{stranger.socket}", "import", str(bundle)], capture_output=True,
                              text=True, timeout=600)
    if imported.returncode != 0 or f"kernels compiled by kilnd {kernels}" not in imported.stdout \
            or "refused" in imported.stdout:
        stranger.stop()
        pytest.fail(f"the import: {imported.stdout}{imported.stderr}")
    return stranger


def test_kernels_keyed_with_torchs_ptxas_come_from_a_strangers_bundle_as_stocks_kernels(tmp_path, kilnd):
    """Where Triton runs torch's ptxas from the start (inductor's compile
    processes), its version is in every kernel's key: the importing kilnd
    compiles them with the ptxas of that version beside its toolchain's
    triton (torch's), which a recording never names, into stock's cubins."""
    stock, _ = run(tmp_path, "stock", "3", "12", "--torch-ptxas")
    run(tmp_path, "kiln", "3", "12", "--torch-ptxas", kilnd=kilnd)
    configs = sum(stock["configs_compiled"].values())
    stranger = strangers_import(tmp_path, kilnd, configs)
    try:
        again, _ = run(tmp_path, "again", "3", "12", "--torch-ptxas", kilnd=stranger)
        assert again["cubins"] == stock["cubins"]
        assert stranger.stats().compiles == configs
    finally:
        stranger.stop()


def test_kernels_compiled_whole_in_kilnds_workers_all_come_from_a_strangers_bundle_and_compile_nothing_again(tmp_path, kilnd):
    """Each kernel a worker compiles for inductor keeps what its key came from
    (kiln.key-inputs.json beside Triton's .source), as the client's own do: an
    unsigned bundle of them brings every one, compiled by the importing kilnd,
    and a graph's process there compiles nothing. (Their cubins are not the
    recording's: here inductor compiles with torch's ptxas, which its keys do
    not name (inductor_kernels_program.py), and the importing kilnd compiles
    with the ptxas they name, its toolchain's own.)"""
    stock, _ = run(tmp_path, "stock", "3", "11")
    run(tmp_path, "kiln", "3", "11", kilnd=kilnd, KILN_INDUCTOR_IN_KILND="1")
    configs = sum(stock["configs_compiled"].values())
    stranger = strangers_import(tmp_path, kilnd, configs)
    try:
        again, _ = run(tmp_path, "again", "3", "11", kilnd=stranger)
        assert again["configs_compiled"] == stock["configs_compiled"]
        stats = stranger.stats()
        assert stats.compiles == configs and rpc_calls(stats, "CompileInductorKernel") == (0, 0), stats
    finally:
        stranger.stop()

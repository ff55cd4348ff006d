"""The kiln CLI and the C++ SDK against a real kilnd: IR files made by the real
triton package, compiled for two targets, must give what Triton gives."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

import hermetic
import kernel_suite
import triton_frontend
from conftest import BUILD, Kilnd, kilnd_processes_with, run_on_terminal, tcp_kilnd

KILN = BUILD / "client" / "cpp" / "kiln"
SDK_PROBE = BUILD / "tests" / "sdk_compile_probe"
CASES = {case.name: case for case in kernel_suite.SUITE}


def kiln(kilnd, *args, check=False):
    result = subprocess.run([str(KILN), "--endpoint", f"unix:{kilnd.socket}", *map(str, args)],
                            capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def stock(case, arch, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / f"stock{arch}"))
    return triton.compile(ASTSource(case.fn, case.signature, case.constexprs), target=GPUTarget("cuda", arch, 32),
                          options=case.options)


def option_flags(case):
    flags = []
    for name in ("num_warps", "num_stages"):
        if name in case.options:
            flags += [f"--{name.replace('_', '-')}", case.options[name]]
    return flags


@pytest.mark.parametrize("name", ["add_fp32", "matmul_fp16_64x64x32_s2"])
def test_cli_compiles_frontend_ttir_for_two_targets_like_triton(kilnd, tmp_path, monkeypatch, name):
    case = CASES[name]
    frontend = triton_frontend.run_frontend(case, GPUTarget("cuda", 90, 32))
    source = tmp_path / f"{frontend.name}.ttir"
    source.write_text(frontend.ttir)
    kiln(kilnd, "compile", source, "--target", "cuda:80", "--target", "cuda:90", *option_flags(case),
         "-o", tmp_path / "out", check=True)
    for arch in (80, 90):
        expected = stock(case, arch, tmp_path, monkeypatch)
        out = tmp_path / "out" / f"cuda_{arch}"
        for ext in ("ttgir", "llir", "ptx"):
            assert (out / f"{frontend.name}.{ext}").read_text() == expected.asm[ext], (arch, ext)
        assert (out / f"{frontend.name}.cubin").read_bytes() == expected.asm["cubin"], arch
        metadata = json.loads((out / f"{frontend.name}.json").read_text())
        assert metadata["shared"] == expected.metadata.shared
        assert "Used" in (out / "ptxas.log").read_text()


@pytest.mark.parametrize("ext", ["ttgir", "llir", "ptx"])
def test_cli_compiles_later_stage_ir_to_tritons_cubin(kilnd, tmp_path, monkeypatch, ext):
    case = CASES["softmax_fp16_w8"]
    expected = stock(case, 90, tmp_path, monkeypatch)
    source = tmp_path / f"softmax_kernel.{ext}"
    source.write_text(expected.asm[ext])
    kiln(kilnd, "compile", source, "--target", "cuda:90", *option_flags(case), "-o", tmp_path / "out",
         check=True)
    assert (tmp_path / "out" / "cuda_90" / "softmax_kernel.cubin").read_bytes() == expected.asm["cubin"]


def test_sdk_compiles_two_targets_concurrently_like_the_cli(kilnd, tmp_path):
    case = CASES["add_fp16_w8"]
    frontend = triton_frontend.run_frontend(case, GPUTarget("cuda", 90, 32))
    source = tmp_path / "add.ttir"
    source.write_text(frontend.ttir)
    options = json.dumps({"num_warps": 8})
    probe = subprocess.run([str(SDK_PROBE), f"unix:{kilnd.socket}", source, tmp_path / "sdk", options,
                            "cuda:80", "cuda:90"], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    kiln(kilnd, "compile", source, "--target", "cuda:80", "--target", "cuda:90", "--num-warps", 8,
         "-o", tmp_path / "cli", check=True)
    for arch in (80, 90):
        assert (tmp_path / "sdk" / f"{arch}.cubin").read_bytes() == \
            (tmp_path / "cli" / f"cuda_{arch}" / f"{frontend.name}.cubin").read_bytes()


def test_bad_file_target_and_kernel_get_clear_errors_and_exit_codes(kilnd, tmp_path):
    missing = kiln(kilnd, "compile", tmp_path / "missing.ttir", "--target", "cuda:90", "-o", tmp_path)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    (tmp_path / "k.txt").write_text("x")
    wrong_kind = kiln(kilnd, "compile", tmp_path / "k.txt", "--target", "cuda:90", "-o", tmp_path)
    assert wrong_kind.returncode == 2 and ".ttir" in wrong_kind.stderr
    frontend = triton_frontend.run_frontend(CASES["add_fp32"], GPUTarget("cuda", 90, 32))
    source = tmp_path / "add.ttir"
    source.write_text(frontend.ttir)
    bad_target = kiln(kilnd, "compile", source, "--target", "cuda:hopper", "-o", tmp_path)
    assert bad_target.returncode == 2 and "bad target" in bad_target.stderr
    garbage = tmp_path / "garbage.ttir"
    garbage.write_text("this is not MLIR")
    unparsable = kiln(kilnd, "compile", garbage, "--target", "cuda:90", "-o", tmp_path)
    assert unparsable.returncode == 5 and "does not parse" in unparsable.stderr
    ptxas = kiln(kilnd, "compile", source, "--target", "cuda:90", "--option", 'ptx_options="--bogus-flag"',
                 "-o", tmp_path)
    assert ptxas.returncode == 5 and "PTXAS" in ptxas.stderr


def test_unreachable_service_exits_3(tmp_path):
    result = subprocess.run([str(KILN), "--endpoint", f"unix:{tmp_path / 'none.sock'}", "stats"],
                            capture_output=True, text=True)
    assert result.returncode == 3
    assert "is kilnd running" in result.stderr


def test_commands_that_need_kilnd_start_the_users_own_once_between_racing_clients(tmp_path, monkeypatch):
    """No kilnd running: `kiln compile` starts the user's kilnd as the Python
    client does, by the same lock, so two CLIs and a Python client racing start
    one. Commands that only report on a kilnd, --no-autostart and a named
    endpoint start none."""
    case = CASES["add_fp32"]
    frontend = triton_frontend.run_frontend(case, GPUTarget("cuda", 90, 32))
    source = tmp_path / f"{frontend.name}.ttir"
    source.write_text(frontend.ttir)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    # The user's kilnd.conf names the toolchain a kilnd on its defaults compiles with.
    (tmp_path / "config" / "kiln").mkdir(parents=True)
    (tmp_path / "config" / "kiln" / "kilnd.conf").write_text(f"toolchain = {sys.executable}\n")
    env = dict(hermetic.stock_env(), XDG_RUNTIME_DIR=str(runtime), XDG_CACHE_HOME=str(tmp_path / "cache"),
               XDG_CONFIG_HOME=str(tmp_path / "config"), KILN_KILND=str(BUILD / "service" / "kilnd"))
    compile_args = ["compile", source, "--target", "cuda:90", "-o", tmp_path / "none"]
    try:
        for args in (["stats"], ["health"], ["gc", "1GiB"], ["misses"], ["--no-autostart", *compile_args],
                     ["--endpoint", f"unix:{runtime / 'kiln' / 'kilnd.sock'}", *compile_args]):
            result = subprocess.run([str(KILN), *map(str, args)], env=env, capture_output=True, text=True, timeout=60)
            assert result.returncode == 3, (args, result.stderr)
        named = subprocess.run([str(KILN), *map(str, compile_args)], capture_output=True, text=True, timeout=60,
                               env=dict(env, KILN_ENDPOINT=f"unix:{runtime / 'kiln' / 'kilnd.sock'}"))
        assert named.returncode == 3, named.stderr
        # A question about a command starts nothing either.
        for command in ("pull", "push", "compile", "import", "export"):
            helped = subprocess.run([str(KILN), command, "--help"], env=env, capture_output=True, text=True, timeout=60)
            assert helped.returncode == 0 and "usage: kiln" in helped.stdout, (command, helped.stderr)
        assert not kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime))

        clis = [subprocess.Popen([str(KILN), "compile", str(source), "--target", f"cuda:{arch}", "-o",
                                  str(tmp_path / "out")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for arch in (80, 90)]
        # The Python client says when it starts kilnd at log level INFO.
        python = subprocess.Popen([sys.executable, "-c", "import logging; logging.basicConfig(level=logging.INFO); "
                                   "from kiln.service import connection as _service; _service.connect()"],
                                  env=env, stderr=subprocess.PIPE, text=True)
        errors = [cli.communicate(timeout=300)[1] for cli in clis]
        assert [cli.returncode for cli in clis] == [0, 0], errors
        errors.append(python.communicate(timeout=60)[1])
        assert python.returncode == 0, errors[-1]
        starts = sum("started one" in error for error in errors[:2]) + errors[-1].count("kiln:starting ")
        assert starts == 1, errors
        assert len(kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime))) == 1
        for arch in (80, 90):
            expected = stock(case, arch, tmp_path, monkeypatch)
            assert (tmp_path / "out" / f"cuda_{arch}" / f"{frontend.name}.cubin").read_bytes() == expected.asm["cubin"]
    finally:
        for pid in kilnd_processes_with("XDG_RUNTIME_DIR", str(runtime)):
            os.kill(pid, signal.SIGTERM)


def test_health_wait_finds_a_kilnd_that_starts_while_it_waits(tmp_path):
    """`kiln health --wait` before kilnd is up (a script starting both, a
    service still starting): the endpoint file appears, on a new port, later."""
    endpoint_file = tmp_path / "run" / "kilnd.endpoint"
    waiting = subprocess.Popen([str(KILN), "health", "--wait", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=dict(os.environ, KILN_ENDPOINT_FILE=str(endpoint_file)))
    time.sleep(1)
    assert waiting.poll() is None, "gave up before kilnd came"
    server = Kilnd(tmp_path / "kilnd", f"--toolchain={sys.executable}", f"--endpoint-file={endpoint_file}")
    try:
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0 and "SERVING" in out, err
    finally:
        waiting.kill()
        server.stop()


def test_health_is_serving_only_with_the_access_token(tmp_path):
    """The health protocol answers anyone; `kiln health` says SERVING only to a
    caller kilnd serves (the endpoint file's token), as every other command."""
    endpoint_file = tmp_path / "run" / "kilnd.endpoint"
    server = Kilnd(tmp_path / "kilnd", f"--endpoint-file={endpoint_file}")
    try:
        address, token = endpoint_file.read_text().splitlines()[:2]
        wrong = tmp_path / "wrong.endpoint"
        wrong.write_text(f"{address}\n{'0' * len(token)}\n")
        for variables, expected in (({"KILN_ENDPOINT_FILE": str(endpoint_file)}, 0),
                                    ({"KILN_ENDPOINT_FILE": str(wrong)}, 4), ({"KILN_ENDPOINT": address}, 4)):
            result = subprocess.run([str(KILN), "health"], capture_output=True, text=True, timeout=60,
                                    env=dict(hermetic.stock_env(), **variables))
            assert result.returncode == expected, (variables, result.stdout, result.stderr)
            assert ("SERVING" in result.stdout) == (expected == 0)
            assert expected == 0 or "access token" in result.stderr, result.stderr
    finally:
        server.stop()


def test_toolchains_stats_json_gc_and_verify(kilnd):
    assert triton.__version__ in kiln(kilnd, "toolchains", check=True).stdout
    stats = json.loads(kiln(kilnd, "stats", "--json", check=True).stdout)
    assert int(stats["entries"]) > 0
    assert "checked" in kiln(kilnd, "verify", check=True).stdout
    bad_size = kiln(kilnd, "gc", "lots")
    assert bad_size.returncode == 2
    assert "evicted" in kiln(kilnd, "gc", "100GiB", check=True).stdout


def test_installed_package_and_kiln_add_kernels_embed_cubins_at_build_time(kilnd, tmp_path):
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], check=True,
                   capture_output=True)
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    frontend = triton_frontend.run_frontend(CASES["add_fp32"], GPUTarget("cuda", 90, 32))
    (kernels / "add.ttir").write_text(frontend.ttir)
    example = Path(__file__).resolve().parents[2] / "examples" / "embedded_kernels"
    build = tmp_path / "build"
    env = dict(__import__("os").environ, KILN_ENDPOINT=f"unix:{kilnd.socket}")
    configure = subprocess.run(["cmake", "-S", str(example), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}",
                                f"-DKERNEL_DIR={kernels}"], capture_output=True, text=True, env=env)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    built = subprocess.run(["cmake", "--build", str(build), "-j2"], capture_output=True, text=True, env=env)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    run = subprocess.run([str(build / "embedded_kernels"), str(tmp_path / "embedded.cubin")],
                         capture_output=True, text=True, check=True)
    assert "cuda:80: add_kernel" in run.stdout and "cuda:90: add_kernel" in run.stdout
    kiln(kilnd, "compile", kernels / "add.ttir", "--target", "cuda:90", "--num-warps", 4, "-o", tmp_path / "cli",
         check=True)
    assert (tmp_path / "embedded.cubin").read_bytes() == \
        (tmp_path / "cli" / "cuda_90" / "add_kernel.cubin").read_bytes()


def test_cli_spreads_targets_over_a_fleets_kilnds_and_moves_on_when_one_is_gone(tmp_path):
    import socket

    with socket.socket() as unused:  # a kilnd that went away: nothing listens there
        unused.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{unused.getsockname()[1]}"
    fleet = []
    try:
        for i in range(2):
            fleet.append(tcp_kilnd(tmp_path / f"kilnd{i}", f"--toolchain={sys.executable}"))
        frontend = triton_frontend.run_frontend(CASES["add_fp32"], GPUTarget("cuda", 90, 32))
        source = tmp_path / "add.ttir"
        source.write_text(frontend.ttir)
        endpoint = ",".join([fleet[0].tcp_address(), fleet[1].tcp_address(), gone])
        result = subprocess.run([str(KILN), "--endpoint", endpoint, "compile", str(source), "--target", "cuda:80",
                                 "--target", "cuda:90", "--target", "cuda:86", "-o", str(tmp_path / "out")],
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        for arch in (80, 86, 90):
            assert (tmp_path / "out" / f"cuda_{arch}" / f"{frontend.name}.cubin").stat().st_size > 0
        # Targets go to the listed kilnds in turn; the one meant for the gone
        # kilnd is compiled by another.
        compiles = [kilnd.stats().compiles for kilnd in fleet]
        assert compiles[0] >= 1 and compiles[1] >= 1 and sum(compiles) == 3, compiles

        unresolvable = subprocess.run([str(KILN), "--endpoint", f"{fleet[0].tcp_address()},no-such-host.invalid:7733",
                                       "stats"], capture_output=True, text=True, timeout=60)
        assert unresolvable.returncode == 3
        assert "no-such-host.invalid:7733" in unresolvable.stderr and "HOST:PORT" in unresolvable.stderr
    finally:
        for kilnd in fleet:
            kilnd.stop()


def test_cli_compile_shows_a_progress_line_on_a_terminal_and_plain_lines_otherwise(kilnd, tmp_path):
    import re

    frontend = triton_frontend.run_frontend(CASES["matmul_fp16_64x64x32_s2"], GPUTarget("cuda", 90, 32))
    source = tmp_path / "matmul.ttir"
    source.write_text(frontend.ttir)
    targets = ["--target", "cuda:80", "--target", "cuda:86", "--target", "cuda:90"]
    command = [str(KILN), "--endpoint", f"unix:{kilnd.socket}", "compile", str(source), *targets,
               *map(str, option_flags(CASES["matmul_fp16_64x64x32_s2"]))]
    returncode, text, errors = run_on_terminal([*command, "-o", str(tmp_path / "tty")])
    assert returncode == 0, errors
    # The status line is redrawn in place ("\r" and erase) while targets compile...
    statuses = re.findall(r"\r\x1b\[2Kcompiling matmul\.ttir: (\d)/3 done, (\d) running, 0 failed, [\d.]+ s", text)
    assert statuses and statuses[0][0] == "0", text
    # ...each result goes above it as it comes, and the line is gone at the end.
    assert len(re.findall(r"cuda:(80|86|90): (compiled|cache hit) -> ", text)) == 3, text
    assert text.endswith("\r\x1b[2K"), repr(text[-80:])

    plain = subprocess.run([*command, "-o", str(tmp_path / "pipe")], capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr
    # Not a terminal: only the results, one line each, no control characters.
    assert len(plain.stdout.splitlines()) == 3 and "\r" not in plain.stdout and "\x1b" not in plain.stdout


def test_a_kilnd_that_stops_answering_ends_each_command_within_its_deadline(tmp_path):
    """kilnd stopped (SIGSTOP): each attempt of a call ends by keepalive in
    about 8 s, and the call, its retries included, by its deadline (30 s for a
    quick one): not 15 minutes for a compile, nor 30 s an attempt."""
    case = CASES["add_fp32"]
    source = tmp_path / "add.ttir"
    source.write_text(triton_frontend.run_frontend(case, GPUTarget("cuda", 90, 32)).ttir)
    server = Kilnd(tmp_path / "kilnd", f"--toolchain={sys.executable}")
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        for args, seconds in ((("stats",), 35), (("compile", source, "--target", "cuda:90", "-o", tmp_path), 35)):
            started = time.monotonic()
            result = kiln(server, *args)
            assert time.monotonic() - started < seconds, args
            assert result.returncode == 3 and "is kilnd running" in result.stderr, (args, result.stderr)
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()

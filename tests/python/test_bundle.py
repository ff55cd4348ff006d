"""Cache bundles (`kiln export`, `kiln import`): a cache shipped to a machine
that then starts warm, and a damaged bundle refused whole. Real kilnds, the
real client compiling the kernel suite."""

import hashlib
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hermetic
import kernel_suite
from bundle_files import openssl, publisher_key, read_bundle, write_bundle
from conftest import BUILD, Kilnd, probe_json, run_on_terminal, run_probe

# kilnd takes outside bytes here: the asan lane runs these against its ASan+UBSan build.
pytestmark = pytest.mark.outside_bytes

KILN = BUILD / "client" / "cpp" / "kiln"


def kiln(kilnd, *args):
    return subprocess.run([str(KILN), "--endpoint", f"unix:{kilnd.socket}", *map(str, args)],
                          capture_output=True, text=True, timeout=600)


def compile_calls(kilnd):
    return sum(rpc.count for rpc in kilnd.stats().rpc_latency if rpc.method == "Compile")


def test_export_then_import_into_an_empty_kilnd_serves_every_entry_without_compiling(tmp_path, stock_suite):  # noqa: F811
    base = hermetic.stock_env()
    bundle = tmp_path / "suite.kilnbundle"
    private, public, key_id = publisher_key(tmp_path)
    source = Kilnd(tmp_path / "source", f"--toolchain={sys.executable}")
    try:
        run_probe(dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{source.socket}",
                       TRITON_CACHE_DIR=str(tmp_path / "c1"), KILN_FILES_DIR=str(tmp_path / "f1")), "suite")
        assert source.stats().compiles == 30
        exported = kiln(source, "export", bundle, "--sign", private)
        assert exported.returncode == 0, exported.stderr
        only_inductor = kiln(source, "export", tmp_path / "none.kilnbundle", "--namespace", "inductor")
        assert only_inductor.returncode == 1 and "nothing written" in only_inductor.stderr, only_inductor
        assert "no entries matched" in only_inductor.stderr and not (tmp_path / "none.kilnbundle").exists()
        recent = kiln(source, "export", tmp_path / "recent.kilnbundle", "--since", "1h")
        assert recent.returncode == 0 and recent.stdout.split()[1] == exported.stdout.split()[1]
    finally:
        source.stop()
    count = int(exported.stdout.split()[1])  # "exported N entries (...) to FILE"
    assert count >= 30, exported.stdout

    target = Kilnd(tmp_path / "target", f"--toolchain={sys.executable}", trusting(public))
    try:
        imported = kiln(target, "import", bundle)
        assert imported.returncode == 0, imported.stderr
        assert f"{count} entries, signed by key {key_id}, which kilnd trusts" in imported.stdout, imported.stdout
        assert import_counts(imported.stdout)["stored"] == count
        # Kiln's defaults: a process's first compile (and later ones) in the process.
        result = probe_json(run_probe(dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{target.socket}",
                                           TRITON_CACHE_DIR=str(tmp_path / "c2"), KILN_FILES_DIR=str(tmp_path / "f2"),
                                           KILN_FIRST_COMPILE_HERE="1", KILN_COMPILE_HERE="1"),
                                      "suite"))
        assert result["kernels"] == stock_suite
        # Nor did the process: its first compile looks only at the files kilnd
        # serves it, which the import wrote.
        assert result["frontend_runs"] == 0, result["frontend_runs"]
        stats = target.stats()
        assert stats.compiles == 0 and compile_calls(target) == 0 and stats.hits >= 30
        again = kiln(target, "import", bundle)  # nothing new: each entry is there with the same bytes
        assert again.returncode == 0 and import_counts(again.stdout)["already stored"] == count, again.stdout
    finally:
        target.stop()

    # A kilnd that does not trust the key, or a bundle with no signature, brings
    # the kernels only, each compiled by kilnd from its recorded TTIR: a client
    # then hits them all, stock's bytes, and runs no frontend of its own. The
    # unsigned one comes through a subscription to a directory (bundle_sources).
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    (tmp_path / "recent.kilnbundle").rename(shelf / "recent.kilnbundle")
    for name, flags in (("untrusted", ()), ("unsigned", (f"--bundle-sources={shelf}",))):
        stranger = Kilnd(tmp_path / name, f"--toolchain={sys.executable}", *flags)
        try:
            if name == "untrusted":
                imported = kiln(stranger, "import", bundle)
                assert imported.returncode == 0, imported.stderr
                assert f"signed by key {key_id}, which kilnd does not trust" in imported.stdout, imported.stdout
                counts = import_counts(imported.stdout)
                assert counts["stored"] == 0 and counts["kernels compiled by kilnd"] == 30, imported.stdout
            else:
                deadline = time.monotonic() + 300
                while stranger.stats().subscriptions[0].imports == 0 and time.monotonic() < deadline:
                    time.sleep(0.2)
                [subscription] = stranger.stats().subscriptions
                assert subscription.error == "" and subscription.imported == "1 of 1 files", subscription
                result = subscription.last_import_result
                assert not result.signed_by and result.stored == 0 and result.compiled == 30, result
            assert stranger.stats().compiles == 30
            result = probe_json(run_probe(dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{stranger.socket}",
                                               TRITON_CACHE_DIR=str(tmp_path / f"c-{name}"),
                                               KILN_FILES_DIR=str(tmp_path / f"f-{name}"),
                                               KILN_FIRST_COMPILE_HERE="1", KILN_COMPILE_HERE="1"), "suite"))
            assert result["kernels"] == stock_suite
            assert result["frontend_runs"] == 0, result["frontend_runs"]
            assert stranger.stats().compiles == 30 and compile_calls(stranger) == 0
        finally:
            stranger.stop()


def test_a_bundle_with_one_flipped_byte_is_refused_and_imports_nothing(tmp_path):
    private, public, _ = publisher_key(tmp_path)
    source = Kilnd(tmp_path / "source")
    try:
        for i in range(3):
            blob = tmp_path / f"b{i}.cubin"
            blob.write_bytes(bytes([i]) * 1000)
            assert kiln(source, "put", "triton", f"key{i}", f"k.cubin={blob}").returncode == 0
        assert kiln(source, "export", tmp_path / "good.kilnbundle", "--sign", private).returncode == 0
    finally:
        source.stop()
    good = (tmp_path / "good.kilnbundle").read_bytes()
    target = Kilnd(tmp_path / "target", trusting(public))
    try:
        for position in (len(good) // 2, len(good) - 110):  # inside an entry; in the checksum
            damaged = bytearray(good)
            damaged[position] ^= 0x01
            (tmp_path / "bad.kilnbundle").write_bytes(bytes(damaged))
            refused = kiln(target, "import", tmp_path / "bad.kilnbundle")
            assert refused.returncode == 2 and "damaged" in refused.stderr, refused.stderr
            assert "nothing was imported" in refused.stderr
        (tmp_path / "short.kilnbundle").write_bytes(good[:-10])
        assert kiln(target, "import", tmp_path / "short.kilnbundle").returncode == 2
        forged = bytearray(good)
        forged[-1] ^= 0x01  # the signature itself
        (tmp_path / "forged.kilnbundle").write_bytes(bytes(forged))
        refused = kiln(target, "import", tmp_path / "forged.kilnbundle")
        assert refused.returncode == 2 and "does not verify" in refused.stderr, refused.stderr
        (tmp_path / "other.txt").write_text("hello")
        other = kiln(target, "import", tmp_path / "other.txt")
        assert other.returncode == 2 and "not a Kiln bundle" in other.stderr
        assert target.stats().entries == 0  # nothing of any of them went in
        assert kiln(target, "import", tmp_path / "good.kilnbundle").returncode == 0
        assert target.stats().entries == 3
        assert kiln(target, "get", "triton", "key1").returncode == 0
    finally:
        target.stop()


def trusting(public_keys_file):
    """kilnd's flag that trusts the keys of `public_keys_file`."""
    return f"--trusted-bundle-keys={public_keys_file}"


def import_counts(output):
    """The counts `kiln import` reports: {"stored": n, "already stored": n, ...}."""
    line = next(line for line in output.splitlines() if line.strip().startswith("stored "))
    return {name.strip(): int(count) for count, name in
            ((m.group(2), m.group(1)) for m in re.finditer(r"([a-z][a-z ]*?) (\d+)", line))}


def test_a_bundle_signed_at_export_names_its_key_and_imports(tmp_path):
    key = tmp_path / "publisher.pem"
    openssl("genpkey", "-algorithm", "ed25519", "-out", key)
    openssl("pkey", "-in", key, "-pubout", "-outform", "DER", "-out", tmp_path / "publisher.der")
    key_id = hashlib.sha256((tmp_path / "publisher.der").read_bytes()[-32:]).hexdigest()  # the raw key ends the DER
    source = Kilnd(tmp_path / "source")
    try:
        blob = tmp_path / "k.cubin"
        blob.write_bytes(os.urandom(5000))
        assert kiln(source, "put", "triton", "signed", f"k.cubin={blob}").returncode == 0
        exported = kiln(source, "export", tmp_path / "signed.kilnbundle", "--sign", key)
        assert exported.returncode == 0 and f"signed by key {key_id}" in exported.stdout, exported
        rsa = tmp_path / "rsa.pem"
        openssl("genpkey", "-algorithm", "rsa", "-out", rsa)
        refused = kiln(source, "export", tmp_path / "no.kilnbundle", "--sign", rsa)
        assert refused.returncode == 2 and "not an unencrypted Ed25519 private key" in refused.stderr
        assert "openssl genpkey -algorithm ed25519" in refused.stderr
        assert not (tmp_path / "no.kilnbundle").exists() and not (tmp_path / "no.kilnbundle.partial").exists()
    finally:
        source.stop()
    signed = (tmp_path / "signed.kilnbundle").read_bytes()
    assert signed.startswith(b"KILNBUNDLE 2\n") and signed[-100:-96] == b"SIG "
    assert signed[-96:-64].hex() == key_id
    # Not trusted: an entry that is no kernel kilnd can compile stays out, and the import says why.
    stranger = Kilnd(tmp_path / "stranger")
    try:
        imported = kiln(stranger, "import", tmp_path / "signed.kilnbundle")
        assert imported.returncode == 0, imported.stderr
        assert f"signed.kilnbundle: 1 entries, signed by key {key_id}, which kilnd does not trust" in imported.stdout
        assert "refused 1: not signed by a key of trusted_bundle_keys" in imported.stdout, imported.stdout
        assert stranger.stats().entries == 0 and kiln(stranger, "get", "triton", "signed").returncode == 1
    finally:
        stranger.stop()
    public = tmp_path / "publisher.pub.pem"
    openssl("pkey", "-in", key, "-pubout", "-out", public)
    # trusted_bundle_keys holds another key first: kilnd finds the bundle's by its id.
    _, other_public, _ = publisher_key(tmp_path, "other")
    (tmp_path / "trusted.pem").write_text(other_public.read_text() + public.read_text())
    target = Kilnd(tmp_path / "target", trusting(tmp_path / "trusted.pem"))
    try:
        imported = kiln(target, "import", tmp_path / "signed.kilnbundle")
        assert imported.returncode == 0, imported.stderr
        assert f"1 entries, signed by key {key_id}, which kilnd trusts" in imported.stdout, imported.stdout
        assert import_counts(imported.stdout)["stored"] == 1
        got = kiln(target, "get", "triton", "signed", "-o", tmp_path / "out")
        assert got.returncode == 0 and (tmp_path / "out" / "k.cubin").read_bytes() == blob.read_bytes()
    finally:
        target.stop()


def test_an_export_says_what_it_left_out_and_writes_no_empty_bundle(tmp_path):
    """Entries over the bundle entry limit are left out: counted in the summary,
    which gives the file's true size, and an export left with nothing writes
    no file and fails, rather than hand a publisher's CI an empty bundle."""
    source = Kilnd(tmp_path / "source")
    try:
        big = tmp_path / "big.bin"
        big.write_bytes(os.urandom(40 << 20))  # over the 32 MiB entry limit
        for key in ("big-1", "big-2", "big-3"):
            assert kiln(source, "put", "triton", key, f"k.cubin={big}").returncode == 0
        bundle = tmp_path / "out.kilnbundle"
        nothing = kiln(source, "export", bundle)
        assert nothing.returncode == 1, nothing
        assert "nothing written" in nothing.stderr and "left out 3 entries (120.0 MiB)" in nothing.stderr, nothing.stderr
        assert "32.0 MiB" in nothing.stderr  # the limit, named in the first one's reason
        assert not bundle.exists() and not bundle.with_name(bundle.name + ".partial").exists()

        small = tmp_path / "small.bin"
        small.write_bytes(os.urandom(5000))
        assert kiln(source, "put", "triton", "small", f"k.cubin={small}").returncode == 0
        some = kiln(source, "export", bundle)
        assert some.returncode == 0, some.stderr
        size = bundle.stat().st_size
        assert size < 10000 and "exported 1 entries (4.9 KiB of blobs" in some.stdout, some.stdout
        assert "left out 3 entries (120.0 MiB)" in some.stdout
        bundle.unlink()

        strict = kiln(source, "export", bundle, "--strict")
        assert strict.returncode != 0 and "export --strict: nothing written" in strict.stderr, strict
        assert not bundle.exists() and not bundle.with_name(bundle.name + ".partial").exists()
    finally:
        source.stop()


def test_kernels_a_client_compiled_itself_while_kilnd_had_no_worker_import_from_a_strangers_bundle(
        tmp_path, stock_suite):  # noqa: F811
    """A process's compiles that find kilnd with no worker up yet run in the
    process, which puts them: they carry what their keys came from, so a
    kilnd that does not trust the bundle compiles every one again from its
    TTIR, as it does the kernels it compiled itself."""
    base = hermetic.stock_env()
    # No toolchain given: the first compile registers the client's Python in
    # the background, and compiles in the client meanwhile.
    source = Kilnd(tmp_path / "source")
    try:
        run_probe(dict(base, KILN="1", KILN_STRICT="1", KILN_COMPILE_HERE="0", KILN_ENDPOINT=f"unix:{source.socket}",
                       TRITON_CACHE_DIR=str(tmp_path / "c1"), KILN_FILES_DIR=str(tmp_path / "f1")), "suite")
        assert source.stats().compiles < 30  # some compiled in the client
        exported = kiln(source, "export", tmp_path / "suite.kilnbundle")
        assert exported.returncode == 0, exported.stderr
    finally:
        source.stop()
    assert import_as_a_stranger(tmp_path, tmp_path / "suite.kilnbundle", "suite", 30)["kernels"] == stock_suite


def import_as_a_stranger(tmp_path, bundle, probe_mode, kernels):
    """Imports `bundle` into a kilnd that trusts no key: each of its `kernels`
    kernels compiles there, none refused or failed. Returns what a client
    then compiles through it (client_probe.py `probe_mode`), which is all hits."""
    stranger = Kilnd(tmp_path / "stranger", f"--toolchain={sys.executable}")
    try:
        imported = kiln(stranger, "import", bundle)
        assert imported.returncode == 0, imported.stderr
        assert import_counts(imported.stdout)["kernels compiled by kilnd"] == kernels, imported.stdout
        assert "refused" not in imported.stdout and "not compiled" not in imported.stdout, imported.stdout
        result = probe_json(run_probe(dict(hermetic.stock_env(), KILN="1", KILN_STRICT="1",
                                           KILN_ENDPOINT=f"unix:{stranger.socket}", TRITON_CACHE_DIR=str(tmp_path / "c2"),
                                           KILN_FILES_DIR=str(tmp_path / "f2")), probe_mode))
        assert stranger.stats().compiles == kernels and compile_calls(stranger) == 0
        return result
    finally:
        stranger.stop()


def test_a_kernel_whose_loop_carries_nothing_compiles_from_a_strangers_bundle_into_stocks_bytes(tmp_path):
    """Its recorded TTIR, rewritten so that its loops keep their names
    (kiln_worker.restore_loop_names), still has the loop's terminator."""
    base = hermetic.stock_env()
    stock = probe_json(run_probe(dict(base, TRITON_CACHE_DIR=str(tmp_path / "stock")), "loops-carrying-nothing"))
    source = Kilnd(tmp_path / "source", f"--toolchain={sys.executable}")
    try:
        run_probe(dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{source.socket}",
                       TRITON_CACHE_DIR=str(tmp_path / "c1"), KILN_FILES_DIR=str(tmp_path / "f1")), "loops-carrying-nothing")
        assert kiln(source, "export", tmp_path / "loops.kilnbundle").returncode == 0
    finally:
        source.stop()
    imported = import_as_a_stranger(tmp_path, tmp_path / "loops.kilnbundle", "loops-carrying-nothing", 2)
    assert imported["kernels"] == stock["kernels"]


def peak_rss_mib(pid):
    """A process's peak resident memory so far (VmHWM), in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


# ASan's shadow memory takes terabytes of address space, more than any limit
# this holds kiln to: the linux lane measures it.
@pytest.mark.release_build
def test_importing_a_3_gib_bundle_holds_a_few_records_at_a_time_in_kiln_and_kilnd(tmp_path):
    """768 entries of 4 MiB: kiln sends it under an address-space limit far
    below its size in 64 MiB, and kilnd holds a few records, not the bundle.
    (The entries share one blob, so the store writes 4 MiB, not 3 GiB: what
    is measured is the import's own memory.)"""
    bundle = tmp_path / "large.kilnbundle"
    data = os.urandom(4 << 20)
    private, public, _ = publisher_key(tmp_path)
    write_bundle(bundle, (("triton", f"large{i}", {"k.cubin": data}) for i in range(768)), signer=private)
    target = Kilnd(tmp_path / "target", trusting(public))
    try:
        kilnd_before = peak_rss_mib(target.process.pid)
        # GNU time reports the import's peak resident memory (KiB) on stderr's last line.
        imported = subprocess.run(["bash", "-c", 'ulimit -v 1048576 && exec /usr/bin/time -f %M "$@"', "kiln",
                                   str(KILN), "--endpoint", f"unix:{target.socket}", "import", str(bundle)],
                                  capture_output=True, text=True, timeout=600)
        assert imported.returncode == 0 and import_counts(imported.stdout)["stored"] == 768, imported
        kilnd_growth = peak_rss_mib(target.process.pid) - kilnd_before
        assert target.stats().entries == 768
        got = kiln(target, "get", "triton", "large767", "-o", tmp_path / "out")
        assert got.returncode == 0 and (tmp_path / "out" / "k.cubin").read_bytes() == data
        assert not any((tmp_path / "target" / "data" / "imports").iterdir())  # the received copy went
    finally:
        target.stop()
    peak_mib = int(imported.stderr.strip().splitlines()[-1]) / 1024
    print(f"import of a {bundle.stat().st_size >> 20} MiB bundle: kiln's peak RSS {peak_mib:.0f} MiB (under a "
          f"1 GiB address-space limit); kilnd's peak grew {kilnd_growth:.0f} MiB")
    # kiln holds a chunk; kilnd a few records and a batch, and its allocator's
    # leftovers of them (32-78 MiB measured), never the bundle.
    assert peak_mib < 64 and kilnd_growth < 256


def test_prewarm_compiles_a_bundle_recorded_for_sm80_into_sm90_entries_that_an_sm90_client_hits(
        tmp_path, stock_suite):  # noqa: F811
    base = hermetic.stock_env()
    bundle = tmp_path / "sm80.kilnbundle"
    recorder = Kilnd(tmp_path / "recorder", f"--toolchain={sys.executable}")
    try:
        recording = dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{recorder.socket}",
                         TRITON_CACHE_DIR=str(tmp_path / "c1"), KILN_FILES_DIR=str(tmp_path / "f1"))
        run_probe(recording, "suite-sm80")
        run_probe(recording, "device-dependent")
        assert kiln(recorder, "export", bundle).returncode == 0
    finally:
        recorder.stop()

    farm = Kilnd(tmp_path / "farm", f"--toolchain={sys.executable}")
    try:
        prewarmed = kiln(farm, "prewarm", bundle, "--target", "cuda:90")
        assert prewarmed.returncode == 0, prewarmed.stderr
        # Triton's frontend asked the recording machine's GPU about this one: its TTIR is not the sm90 one.
        assert "device_dependent_kernel cuda:90: skipped: its frontend read the GPU of the machine that recorded " \
               "it (none)" in prewarmed.stdout
        assert "prewarmed 16 kernels for 1 targets: 15 compiled, 0 already cached, 1 skipped, 0 failed" \
            in prewarmed.stdout, prewarmed.stdout
        assert farm.stats().compiles == 15
        # A client of the new target: every kernel a hit, equal to stock's own sm90 compile.
        client = dict(base, KILN="1", KILN_STRICT="1", KILN_ENDPOINT=f"unix:{farm.socket}",
                      TRITON_CACHE_DIR=str(tmp_path / "c2"), KILN_FILES_DIR=str(tmp_path / "f2"))
        result = probe_json(run_probe(client, "suite-sm90"))
        assert result["kernels"] == {name: kernel for name, kernel in stock_suite.items() if name.endswith("-sm90")}
        assert result["frontend_runs"] == 0
        assert farm.stats().compiles == 15 and compile_calls(farm) == 0
        # What was prewarmed records its own key inputs: prewarming again finds it all.
        again = kiln(farm, "prewarm", bundle, "--target", "cuda:90")
        assert "15 compiled" not in again.stdout and farm.stats().compiles == 15
    finally:
        farm.stop()


def test_python_prewarm_reads_the_bundle_itself_and_refuses_a_damaged_one(tmp_path, stock_suite):  # noqa: F811
    base = hermetic.stock_env()
    bundle = tmp_path / "first.kilnbundle"
    recorder = Kilnd(tmp_path / "recorder", f"--toolchain={sys.executable}")
    try:
        run_probe(dict(base, KILN="1", KILN_ENDPOINT=f"unix:{recorder.socket}", TRITON_CACHE_DIR=str(tmp_path / "c1"),
                       KILN_FILES_DIR=str(tmp_path / "f1")), "first")  # the first suite kernel, at sm90
        # Signed: prewarm reads the signature record past the checksum, and needs no trust (kilnd compiles).
        openssl("genpkey", "-algorithm", "ed25519", "-out", tmp_path / "key.pem")
        assert kiln(recorder, "export", bundle, "--namespace", "triton", "--sign", tmp_path / "key.pem").returncode == 0
    finally:
        recorder.stop()
    damaged = tmp_path / "damaged.kilnbundle"
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 1
    damaged.write_bytes(bytes(data))

    farm = Kilnd(tmp_path / "farm", f"--toolchain={sys.executable}")
    try:
        env = dict(base, KILN_ENDPOINT=f"unix:{farm.socket}")

        def python_prewarm(path, *targets):
            return subprocess.run([sys.executable, "-m", "kiln", "prewarm", str(path), *targets],
                                  capture_output=True, text=True, env=env, timeout=600)

        refused = python_prewarm(damaged, "--target", "cuda:80")
        assert refused.returncode == 2 and "is damaged" in refused.stderr and farm.stats().entries == 0
        assert python_prewarm(bundle, "--target", "sm_80").returncode == 2
        done = python_prewarm(bundle, "--target", "cuda:80")
        assert done.returncode == 0, done.stderr
        assert "prewarmed 1 kernels for 1 targets: 1 compiled" in done.stdout
        result = probe_json(run_probe(dict(env, KILN="1", KILN_STRICT="1", TRITON_CACHE_DIR=str(tmp_path / "c2"),
                                           KILN_FILES_DIR=str(tmp_path / "f2")), "first-sm80"))
        assert result["kernels"] == {name: kernel for name, kernel in stock_suite.items()
                                     if name == f"{kernel_suite.SUITE[0].name}-sm80"}
        assert result["frontend_runs"] == 0 and farm.stats().compiles == 1

        # On a terminal, both show a status line redrawn in place, results above it, gone at the end.
        for command, targets in (([str(KILN), "--endpoint", f"unix:{farm.socket}"], ["cuda:86", "cuda:90"]),
                                 ([sys.executable, "-m", "kiln"], ["cuda:89"])):
            returncode, text, errors = run_on_terminal(
                [*command, "prewarm", str(bundle), *(flag for t in targets for flag in ("--target", t))], env=env)
            assert returncode == 0, errors
            assert re.search(rf"\r\x1b\[2Kprewarming first\.kilnbundle: \d/{len(targets)} done, \d running, "
                             r"0 failed, [\d.]+ s", text), repr(text)
            assert len(re.findall(r"add_kernel cuda:(86|89|90): compiled\r?\n", text)) == len(targets), repr(text)
            assert text.endswith("\r\x1b[2K"), repr(text[-80:])
        assert farm.stats().compiles == 4
    finally:
        farm.stop()

    # A kilnd with no toolchain of the bundle's Triton: the first answer says so, and nothing more is sent.
    bare = Kilnd(tmp_path / "bare")
    try:
        many = [flag for arch in range(80, 92) for flag in ("--target", f"cuda:{arch}")]
        for command in ([str(KILN), "--endpoint", f"unix:{bare.socket}"], [sys.executable, "-m", "kiln"]):
            stopped = subprocess.run([*command, "prewarm", str(bundle), *many], capture_output=True, text=True,
                                     env=dict(env, KILN_ENDPOINT=f"unix:{bare.socket}"), timeout=120)
            assert stopped.returncode == 4, stopped
            assert "no registered toolchain has triton key" in stopped.stderr
            assert re.search(r"stopped after that error; [1-9]\d* kernel and target pairs were not sent",
                             stopped.stderr), stopped.stderr
    finally:
        bare.stop()


def test_a_crafted_bundle_changes_nothing_a_client_is_served_and_says_what_it_refused(tmp_path):
    """A launcher module (named as one, or an x86-64 ELF named as anything), an
    inductor entry, a memo, and an entry that replaces a stored one: unsigned,
    none of it goes in; signed by a trusted key, only the inductor entry does,
    and the stored entry is replaced only when the import asks."""
    private, public, _ = publisher_key(tmp_path)
    x86_64_elf = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HH", 3, 62) + bytes(44)
    crafted = [("triton-files", "ab" * 32 + "/__triton_launcher.cpython-311-x86_64-linux-gnu.so",
                {"__triton_launcher.cpython-311-x86_64-linux-gnu.so": b"#!/bin/sh\necho owned\n"}),
               ("triton", "disguised", {"k.json": x86_64_elf}),
               ("inductor", "graph", {"graph.py": b"import os\nos.system('echo owned')\n"}),
               ("kiln-memos", "memo", {"memo.json": b"{}"}),
               ("triton", "existing", {"k.cubin": b"the attacker's cubin"})]
    write_bundle(tmp_path / "unsigned.kilnbundle", crafted)
    write_bundle(tmp_path / "signed.kilnbundle", crafted, signer=private)
    target = Kilnd(tmp_path / "target", trusting(public))
    try:
        (tmp_path / "k.cubin").write_bytes(b"the real cubin")
        assert kiln(target, "put", "triton", "existing", f"k.cubin={tmp_path / 'k.cubin'}").returncode == 0

        def served_cubin():
            got = kiln(target, "get", "triton", "existing", "-o", tmp_path / "out")
            assert got.returncode == 0, got.stderr
            return (tmp_path / "out" / "k.cubin").read_bytes()

        imported = kiln(target, "import", tmp_path / "unsigned.kilnbundle")
        assert imported.returncode == 0, imported.stderr
        assert "5 entries, unsigned" in imported.stdout
        assert "refused 2: native code" in imported.stdout, imported.stdout
        assert "refused 1: a memo of the machine that made it (kiln-memos)" in imported.stdout
        assert "refused 2: not signed by a key of trusted_bundle_keys" in imported.stdout
        assert import_counts(imported.stdout)["stored"] == 0
        assert target.stats().entries == 1 and served_cubin() == b"the real cubin"

        imported = kiln(target, "import", tmp_path / "signed.kilnbundle")
        assert imported.returncode == 0, imported.stderr
        assert "refused 2: native code" in imported.stdout and "refused 1: a memo" in imported.stdout
        counts = import_counts(imported.stdout)
        assert (counts["stored"], counts["stored with other bytes"]) == (1, 1), imported.stdout
        assert "kept; --replace replaces them" in imported.stdout
        assert served_cubin() == b"the real cubin"
        for namespace, key in (("triton-files", crafted[0][1]), ("triton", "disguised"), ("kiln-memos", "memo")):
            assert kiln(target, "get", namespace, key).returncode == 1
        assert kiln(target, "get", "inductor", "graph").returncode == 0

        replaced = kiln(target, "import", tmp_path / "signed.kilnbundle", "--replace")
        assert replaced.returncode == 0 and "(replaced: 1)" in replaced.stdout, replaced.stdout
        assert served_cubin() == b"the attacker's cubin"  # its trusted publisher meant it
    finally:
        target.stop()


def test_a_bad_entry_after_good_ones_leaves_nothing_stored(tmp_path):
    private, public, _ = publisher_key(tmp_path)
    good = [("triton", f"good{i}", {"k.cubin": os.urandom(3000)}) for i in range(3)]
    write_bundle(tmp_path / "bad.kilnbundle", [*good, ("triton", "bad", {"../escape": b"x"})], signer=private)
    target = Kilnd(tmp_path / "target", trusting(public))
    try:
        refused = kiln(target, "import", tmp_path / "bad.kilnbundle")
        assert refused.returncode == 2, refused
        assert "entry 4 (triton/bad)" in refused.stderr and "nothing was imported" in refused.stderr, refused.stderr
        assert target.stats().entries == 0
    finally:
        target.stop()


def test_the_launchers_a_recording_built_are_built_ahead_after_an_import_from_what_generated_them(tmp_path):
    """A launcher kilnd built for its local client leaves a recipe (its
    module name, Triton and make_launcher's arguments: no code) that an export
    carries. An import, trusted or not, builds each launcher in the background
    from source its own Triton generates; a recipe holding anything else is
    refused."""
    from kiln.service import api
    from kiln.triton.versions import triton_key
    from test_launcher import CUDA_STUBS, add_kernel_launcher_source, launcher_request

    stub_dir = next((d for d in CUDA_STUBS if (d / "libcuda.so").exists()), None)
    if stub_dir is None:
        pytest.skip("no CUDA toolkit stub libcuda.so on this machine")
    libcuda = tmp_path / "libcuda"
    libcuda.mkdir()
    (libcuda / "libcuda.so.1").symlink_to(stub_dir / "libcuda.so")
    arguments = repr(({(4,): 1024}, {0: "*fp32", 1: "*fp32", 2: "*fp32", 3: "i32", 4: "constexpr"}, None))
    request = launcher_request(add_kernel_launcher_source(), libcuda)
    request.triton_key = triton_key()
    request.origin.make_launcher_args = arguments
    bundle = tmp_path / "launchers.kilnbundle"
    recorder = Kilnd(tmp_path / "recorder", f"--toolchain={sys.executable}")
    try:
        built = recorder.stub.BuildLauncher(request)
        assert built.WhichOneof("result") == "module", built.error
        deadline = time.monotonic() + 30
        while recorder.stats().entries < 2 and time.monotonic() < deadline:  # the launcher, then its recipe
            time.sleep(0.1)
        exported = kiln(recorder, "export", bundle)
        assert exported.returncode == 0, exported.stderr
    finally:
        recorder.stop()
    [recipe] = [entry for entry in read_bundle(bundle) if entry.namespace == "kiln.launchers"]
    assert [blob.name for blob in recipe.blobs] == ["kiln.launcher-recipe.pb"]
    kept = api.BuildLauncherRequest.FromString(recipe.blobs[0].data)
    assert (kept.module_name, kept.triton_key, kept.origin.make_launcher_args, kept.c_source) == \
        ("__triton_launcher", triton_key(), arguments, "")

    target = Kilnd(tmp_path / "unsigned", f"--toolchain={sys.executable}")
    try:
        imported = kiln(target, "import", bundle)
        assert imported.returncode == 0, imported.stderr
        assert "launchers to build ahead, in the background: 1" in imported.stdout, imported.stdout
        deadline = time.monotonic() + 60
        while target.stats().launcher_builds < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert target.stats().launcher_builds == 1, (tmp_path / "unsigned" / "kilnd.out").read_text()
    finally:
        target.stop()

    # A recipe with C in it is not a recipe: kilnd builds only what its own Triton generates.
    forged = api.BuildLauncherRequest(module_name="__triton_launcher", triton_key=triton_key(),
                                      c_source="int main(void) { return 0; }")
    forged.origin.make_launcher_args = arguments
    crafted = tmp_path / "crafted.kilnbundle"
    write_bundle(crafted, [("kiln.launchers", "ab" * 32, {"kiln.launcher-recipe.pb": forged.SerializeToString()})])
    target = Kilnd(tmp_path / "crafted", f"--toolchain={sys.executable}")
    try:
        imported = kiln(target, "import", crafted)
        assert imported.returncode == 0, imported.stderr
        assert "refused 1: a launcher recipe (kiln.launchers) that is not one blob" in imported.stdout, imported.stdout
        time.sleep(1)
        assert target.stats().launcher_builds == 0
    finally:
        target.stop()

    # make_launcher's arguments are a literal, never run, and a hostile one
    # costs its own launcher only: huge, code, nested past the parser, or of
    # another shape.
    marker = tmp_path / "ran"
    hostile = {"huge": repr(("a" * (4 << 20),)), "code": f"__import__('os').system('touch {marker}')",
               "nested": "(" * 30_000 + ")" * 30_000, "shape": repr({"signature": 1})}
    entries = []
    for number, literal in enumerate(hostile.values()):
        recipe = api.BuildLauncherRequest(module_name="__triton_launcher", triton_key=triton_key())
        recipe.origin.make_launcher_args = literal
        entries.append(("kiln.launchers", f"{number:064x}", {"kiln.launcher-recipe.pb": recipe.SerializeToString()}))
    write_bundle(crafted, entries)
    target = Kilnd(tmp_path / "hostile-recipes", f"--toolchain={sys.executable}")
    try:
        imported = kiln(target, "import", crafted)
        assert imported.returncode == 0, imported.stderr
        log = tmp_path / "hostile-recipes" / "kilnd.out"
        deadline = time.monotonic() + 60
        while log.read_text().count("not built ahead") < len(hostile) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert log.read_text().count("not built ahead") == len(hostile), log.read_text()[-3000:]
        stats = target.stats()  # still serving, with every worker it started
        assert stats.launcher_builds == 0 and stats.workers_lost == 0 and not marker.exists()
    finally:
        assert target.stop() == 0


"""GPU checks of the Python client, run on the GPU machine (see docs/python-client.md):

  python3 tests/gpu/gpu_checks.py gpu_bundle

gpu_bundle/ holds kilnd, its worker script and shared libraries, and the
client wheel (built on the development machine). Starts kilnd, installs the
client, then runs with KILN=1 and KILN_STRICT=1 (so nothing silently falls
back to stock Triton): the add kernel from the triton-windows README, and
torch.compile of an MLP and an attention block against eager. Then a second
round in fresh processes with empty Triton, inductor and Kiln file caches must
compile nothing: kilnd's stats prove every kernel and launcher came from its
cache.
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hermetic  # noqa: E402  (tests/hermetic.py)

from gpu_bundle import install_client

HERE = Path(__file__).resolve().parent


def kilnd_stats(bundle, env):
    text = subprocess.run([str(bundle / "kiln"), "stats"], capture_output=True, text=True, env=env,
                          check=True).stdout
    numbers = {}
    for name, pattern in {"compiles": r"compile: (\d+) run", "launcher_builds": r"launchers: (\d+) built",
                          "hits": r"lookups: (\d+) hits", "launcher_hits": r"built, (\d+) cache hits"}.items():
        numbers[name] = int(re.search(pattern, text).group(1))
    return numbers, text


def run_round(name, env, work):
    env = dict(env, TRITON_CACHE_DIR=str(work / name / "triton"),
               TORCHINDUCTOR_CACHE_DIR=str(work / name / "inductor"), KILN_FILES_DIR=str(work / name / "files"))
    ok = True
    for program in ("add", "models"):
        result = subprocess.run([sys.executable, str(HERE / "gpu_programs.py"), program], capture_output=True,
                                text=True, env=env)
        print(result.stdout.rstrip())
        if result.returncode != 0:
            print(result.stderr[-3000:])
            ok = False
    return ok


def main():
    hermetic.enter()  # none of this account's kilnd, caches or files
    bundle = Path(sys.argv[1]).resolve()
    install_client(bundle)
    work = Path(tempfile.mkdtemp(prefix="kiln-gpu-"))
    env = dict(os.environ, LD_LIBRARY_PATH=str(bundle / "lib"), KILN_ENDPOINT=f"unix:{work / 'kilnd.sock'}")
    kilnd = subprocess.Popen([str(bundle / "kilnd"), f"--data-dir={work / 'data'}",
                              f"--local-socket={work / 'kilnd.sock'}", f"--toolchain={sys.executable}"],
                             env=env, stdout=open(work / "kilnd.log", "w"), stderr=subprocess.STDOUT)
    subprocess.run([str(bundle / "kiln"), "health", "--wait", "60"], env=env, check=True)
    client_env = {k: v for k, v in env.items() if k != "LD_LIBRARY_PATH"}
    client_env.update(KILN="1", KILN_STRICT="1")
    try:
        print("== round 1: compiles through kilnd")
        first_ok = run_round("first", client_env, work)
        after_first, _ = kilnd_stats(bundle, env)
        print("== round 2: fresh processes and empty local caches")
        second_ok = run_round("second", client_env, work)
        after_second, text = kilnd_stats(bundle, env)
        print(text)
        new_compiles = after_second["compiles"] - after_first["compiles"]
        new_builds = after_second["launcher_builds"] - after_first["launcher_builds"]
        served = after_second["hits"] - after_first["hits"]
        print(f"round 1: {after_first['compiles']} kernels compiled, {after_first['launcher_builds']} launchers built")
        print(f"round 2: {new_compiles} kernels compiled, {new_builds} launchers built, {served} served from cache")
        cached_ok = new_compiles == 0 and new_builds == 0 and served > 0 and after_first["compiles"] > 0
        for label, ok in (("round 1 results", first_ok), ("round 2 results", second_ok),
                          ("round 2 all from kilnd's cache", cached_ok)):
            print(f"{'PASS' if ok else 'FAIL'}: {label}")
        return 0 if first_ok and second_ok and cached_ok else 1
    finally:
        kilnd.terminate()
        kilnd.wait()


if __name__ == "__main__":
    sys.exit(main())

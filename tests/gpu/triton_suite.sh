#!/usr/bin/env bash
# Runs a part of Triton's own upstream unit tests on the GPU machine, stock and through Kiln,
# and compares the outcomes. From the repository root:
#
#   tests/gpu/triton_suite.sh gpu_bundle third_party/triton-tests MODE...
#
# MODE, run in the order given: stock (no KILN variables), kiln-cold (KILN=1 KILN_STRICT=1
# against a kilnd with an empty data dir), kiln-warm (the same kilnd again, warm when
# kiln-cold ran before it). gpu_bundle/ comes from scripts/make-gpu-bundle,
# third_party/triton-tests/ from scripts/fetch-triton-tests; nothing is fetched here.
#
# Every mode runs in fresh empty Triton, inductor, Kiln-files and HOME directories:
#   python3 -m pytest -n 16 unit/language/{test_standard,test_random,test_compile_errors,
#     test_matmul,test_conversions}.py unit/language/test_core.py (only tests matching
#     bin_op, reduce, where, cast or dot) unit/runtime/{test_cache,test_autotuner,test_launch}.py
# The test_core filter is one -k over the whole run: "not test_core.py or (FILTER)".
#
# Environment:
#   TRITON_SUITE_FILTER   pytest arguments (shell words, quotes allowed) that replace the test
#                         selection above, for a quick run: "unit/runtime/test_launch.py" or
#                         "unit/language/test_core.py -k 'bin_op and int8'"
#   TRITON_SUITE_CORE_K   the test_core filter (default "bin_op or reduce or where or cast or dot")
#   TRITON_SUITE_JOBS     pytest-xdist workers (16)
#   TRITON_SUITE_TIMEOUT  seconds one mode may run before pytest is interrupted (none)
#   TRITON_SUITE_PYTHON   the Python with torch and triton (python3); kilnd compiles with it too
#   OUT                   where the reports go (default: WORK/out): summary.txt, diff.txt,
#                         MODE.xml, kilnd-stats.txt, logs.tar.gz (pytest and kilnd logs)
# Exits 0 when every mode ran and no kiln mode fails a test that passes in stock.
set -uo pipefail
# None of this account's kilnd, caches or files (tests/hermetic.py), around every mode.
[[ -n ${KILN_TEST_ROOT:-} ]] ||
  exec "${TRITON_SUITE_PYTHON:-python3}" "$(dirname "$0")/../hermetic.py" -- "$0" "$@"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 3 ]] || usage
bundle=$(cd "$1" && pwd) || usage
tests=$(cd "$2" && pwd) || usage
shift 2
modes=("$@")
for m in "${modes[@]}"; do
  [[ $m == stock || $m == kiln-cold || $m == kiln-warm ]] || { echo "unknown mode '$m'" >&2; usage; }
done
for f in kilnd kiln kiln_worker.py; do
  [[ -f $bundle/$f ]] || { echo "$bundle/$f is missing (scripts/make-gpu-bundle)" >&2; exit 2; }
done
[[ -d $tests/python/test/unit ]] || { echo "$tests/python/test/unit is missing (scripts/fetch-triton-tests)" >&2; exit 2; }

py=$(command -v "${TRITON_SUITE_PYTHON:-python3}") || { echo "no python3" >&2; exit 2; }
jobs=${TRITON_SUITE_JOBS:-16}
core_k=${TRITON_SUITE_CORE_K:-bin_op or reduce or where or cast or dot}
report=$(cd "$(dirname "$0")" && pwd)/triton_suite_report.py
work=$(mktemp -d /tmp/triton-suite.XXXXXX)
out=${OUT:-$work/out}
mkdir -p "$out" "$work/logs"
sock=$work/kilnd.sock
kilnd_pid=
kilnd_runs=0

kiln_cli() { LD_LIBRARY_PATH=$bundle/lib KILN_ENDPOINT=unix:$sock "$bundle/kiln" "$@"; }

# One number from kilnd's stats (kiln stats --json), empty when kilnd does not answer.
kilnd_stat() {
  kiln_cli stats --json 2>/dev/null |
    "$py" -c 'import json, sys; print(int(json.load(sys.stdin).get(sys.argv[1], 0)))' "$1" 2>/dev/null
}

stop_kilnd() {
  if [[ -n $kilnd_pid ]] && kill -0 "$kilnd_pid" 2>/dev/null; then
    kill -TERM "$kilnd_pid"
    wait "$kilnd_pid" 2>/dev/null
  fi
  kilnd_pid=
}

# A kilnd with an empty data dir of its own.
start_kilnd() {
  stop_kilnd
  kilnd_runs=$((kilnd_runs + 1))
  local data=$work/kilnd-data.$kilnd_runs
  LD_LIBRARY_PATH=$bundle/lib "$bundle/kilnd" --data-dir="$data" --local-socket="$sock" \
    --toolchain="$py" >>"$work/logs/kilnd.log" 2>&1 &
  kilnd_pid=$!
  if ! kiln_cli health --wait 60 >/dev/null; then
    echo "kilnd did not become healthy; its log:"
    tail -20 "$work/logs/kilnd.log"
    return 1
  fi
  echo "kilnd started (pid $kilnd_pid, data dir $data, toolchain $py)"
}

install_wheels() {
  local pip=("$py" -m pip install --quiet --no-index --no-deps --no-cache-dir --disable-pip-version-check)
  export PIP_ROOT_USER_ACTION=ignore
  if ! "$py" -c 'import expecttest' 2>/dev/null; then
    "${pip[@]}" "$tests"/wheels/expecttest-*.whl || return 1
    echo "installed $(basename "$tests"/wheels/expecttest-*.whl)"
  fi
  if ! "$py" -c 'import xdist' 2>/dev/null; then
    if ! "$py" -c 'import execnet' 2>/dev/null; then
      "${pip[@]}" "$tests"/wheels/execnet-*.whl || return 1
    fi
    "${pip[@]}" "$tests"/wheels/pytest_xdist-*.whl || return 1
    echo "installed $(basename "$tests"/wheels/pytest_xdist-*.whl)"
  fi
  # Into the site directory (not --target) so that kiln-activate.pth runs at interpreter start.
  "${pip[@]}" --force-reinstall "$bundle"/kiln_triton-*.whl || return 1
  local manager
  manager=$(env KILN=1 KILN_ENDPOINT="unix:$sock" "$py" -c 'import os; print(os.environ.get("TRITON_CACHE_MANAGER", ""))')
  [[ -n $manager ]] || { echo "the kiln client's .pth did not activate"; return 1; }
  echo "installed $(basename "$bundle"/kiln_triton-*.whl) (KILN=1 sets TRITON_CACHE_MANAGER=$manager)"
}

# The exported tests, copied so that the carried folder stays clean; third_party/nvidia/...
# is where runtime/test_launch.py looks for libdevice in Triton's tree, linked here to the
# installed triton's copy.
prepare_tests() {
  cp -r "$tests" "$work/triton-tests"
  local libdevice
  libdevice=$("$py" -c 'import os, triton; print(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "lib", "libdevice.10.bc"))' 2>/dev/null)
  if [[ -f $libdevice ]]; then
    mkdir -p "$work/triton-tests/third_party/nvidia/backend/lib"
    ln -s "$libdevice" "$work/triton-tests/third_party/nvidia/backend/lib/libdevice.10.bc"
    echo "tests copied to $work/triton-tests; libdevice linked where test_launch.py looks"
  else
    echo "tests copied to $work/triton-tests; no libdevice found (test_launch_with_options[options2] will fail)"
  fi
}

run_mode() {
  local mode=$1 dir
  dir=$(mktemp -d "$work/$mode.XXXXXX")
  mkdir -p "$dir/triton" "$dir/inductor" "$dir/files" "$dir/home/.cache"
  local env_args=(-u TRITON_CACHE_MANAGER)
  local v
  # Kiln's settings go; the harness's (tests/hermetic.py) stay.
  for v in $(compgen -e | grep '^KILN' | grep -vx 'KILN_TEST_ROOT\|KILN_MACHINE_RUNTIME_DIR'); do
    env_args+=(-u "$v")
  done
  env_args+=(TRITON_CACHE_DIR="$dir/triton" TORCHINDUCTOR_CACHE_DIR="$dir/inductor" HOME="$dir/home"
             XDG_CACHE_HOME="$dir/home/.cache" PYTHONUNBUFFERED=1)
  if [[ $mode == kiln-* ]]; then
    if [[ $mode == kiln-cold ]] && [[ -z $kilnd_pid || $(kilnd_stat entries) != 0 ]]; then
      start_kilnd || return 1
    elif ! kiln_cli health >/dev/null 2>&1; then
      start_kilnd || return 1
    fi
    local entries compiles
    entries=$(kilnd_stat entries)
    compiles=$(kilnd_stat compiles)
    if [[ $entries == 0 ]]; then
      echo "[$mode] kilnd is cold: empty cache"
    else
      echo "[$mode] kilnd is warm: $entries cache entries, $compiles compiles so far"
    fi
    env_args+=(KILN=1 KILN_STRICT=1 KILN_ENDPOINT="unix:$sock" KILN_FILES_DIR="$dir/files")
    kiln_cli stats --json >"$work/$mode.stats-before.json"
  fi

  local selection=()
  if [[ -n ${TRITON_SUITE_FILTER:-} ]]; then
    eval "selection=($TRITON_SUITE_FILTER)"
  else
    selection=(unit/language/test_standard.py unit/language/test_random.py unit/language/test_compile_errors.py
               unit/language/test_matmul.py unit/language/test_conversions.py unit/language/test_core.py
               unit/runtime/test_cache.py unit/runtime/test_autotuner.py unit/runtime/test_launch.py
               -k "not test_core.py or ($core_k)")
  fi
  local limit=()
  [[ -n ${TRITON_SUITE_TIMEOUT:-} ]] && limit=(timeout -s INT -k 60 "$TRITON_SUITE_TIMEOUT")
  local xml=$work/$mode.xml log=$work/logs/$mode.log start end rc
  local a shown=
  for a in "${selection[@]}"; do [[ $a == *' '* ]] && shown+="\"$a\" " || shown+="$a "; done
  echo "[$mode] pytest -n $jobs $shown"
  start=$(date +%s.%N)
  (cd "$work/triton-tests/python/test" &&
   "${limit[@]}" env "${env_args[@]}" "$py" -m pytest -n "$jobs" -q -p no:cacheprovider -rf --rootdir=. \
     --junitxml="$xml" "${selection[@]}") >"$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  "$py" -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.2f}")' "$start" "$end" >"$work/$mode.wall"
  echo "[$mode] pytest exit $rc: $(grep -E '(passed|failed|errors?|skipped|deselected|no tests ran).* in [0-9.]+s' "$log" | tail -1 | sed -E 's/=//g; s/^ +| +$//g')"
  "$py" "$report" mode "$mode" "$xml" "$(cat "$work/$mode.wall")"
  if [[ $rc -ne 0 && $rc -ne 1 ]]; then
    echo "[$mode] pytest did not complete (exit $rc); end of its output:"
    tail -25 "$log"
  fi
  [[ -f $xml ]] && cp "$xml" "$out/$mode.xml"
  if [[ $mode == kiln-* ]]; then
    kiln_cli stats --json >"$work/$mode.stats-after.json" 2>/dev/null
    "$py" - "$mode" "$work/$mode.stats-before.json" "$work/$mode.stats-after.json" <<'EOF'
import json, sys
mode, before, after = sys.argv[1], *sys.argv[2:]
try:
    a, b = json.load(open(before)), json.load(open(after))
except (OSError, ValueError):
    print(f"[{mode}] kilnd stats unavailable (kilnd gone?)")
    sys.exit()
names = ["compiles", "compile_cache_hits", "single_flight_joins", "compile_failures", "hits", "misses",
         "puts", "launcher_builds", "launcher_cache_hits", "workers_lost"]
delta = ", ".join(f"{n} {int(b.get(n, 0)) - int(a.get(n, 0))}" for n in names)
print(f"[{mode}] kilnd during this mode: {delta}; now {b.get('entries')} entries, "
      f"{int(b.get('stored_bytes', 0)) / 2**20:.0f} MiB, {float(b.get('compile_seconds', 0)):.0f} compile-seconds total")
EOF
    { echo "== after $mode"; kiln_cli stats; } >>"$out/kilnd-stats.txt" 2>&1
    kill -0 "$kilnd_pid" 2>/dev/null || echo "[$mode] kilnd is no longer running"
  fi
  [[ $rc -eq 0 || $rc -eq 1 ]]
}

main() {
  trap stop_kilnd EXIT  # main runs in the pipeline's subshell, which owns kilnd
  echo "triton_suite: modes ${modes[*]}; work dir $work; reports in $out"
  echo "tests: $(head -1 "$tests/COMMIT" 2>/dev/null) ($(sed -n 's/^ref: //p' "$tests/COMMIT" 2>/dev/null))"
  "$py" - <<'EOF'
import importlib.metadata as md, sys
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "absent"
print(f"python {sys.version.split()[0]}, torch {version('torch')}, triton {version('triton')}, "
      f"pytest {version('pytest')}")
EOF
  command -v nvidia-smi >/dev/null && echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $(nproc) CPUs"
  install_wheels || { echo "installing the wheels failed"; return 1; }
  prepare_tests
  local status=0 m
  [[ " ${modes[*]} " == *" kiln-"* ]] && { start_kilnd || return 1; }
  for m in "${modes[@]}"; do
    run_mode "$m" || status=1
  done
  "$py" "$report" compare "$work" "$out/diff.txt" "${modes[@]}" || status=1
  stop_kilnd
  tar -czf "$out/logs.tar.gz" -C "$work" logs
  echo "reports in $out:" "$(cd "$out" && echo *)"
  return $status
}

main 2>&1 | tee "$out/summary.txt"
status=${PIPESTATUS[0]}
exit "$status"

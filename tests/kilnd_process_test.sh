#!/usr/bin/env bash
# End-to-end test of the real kilnd and kiln binaries: start, serve over the
# per-user socket, refuse a second instance, stop cleanly on SIGTERM, and leave
# a database that passes SQLite's integrity check.
# usage: kilnd_process_test.sh KILND KILN
set -euo pipefail
kilnd=$1
kiln=$2
work=$(mktemp -d /tmp/kiln-proc.XXXXXX)
export XDG_RUNTIME_DIR=$work/run XDG_CACHE_HOME=$work/cache XDG_CONFIG_HOME=$work/config
unset KILN_ENDPOINT
pid=
cleanup() {
  [[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null || true
  if [[ ${passed:-0} == 1 ]]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; cat "$work/kilnd.out" 2>/dev/null || true; exit 1; }

# Bad configuration: a clear message and exit code 2, before anything starts.
if "$kilnd" --max-cache-size=lots 2>"$work/bad.err"; then fail "accepted a bad size"; fi
grep -q "max_cache_size" "$work/bad.err" || fail "bad size error does not name the setting"

"$kilnd" >"$work/kilnd.out" 2>&1 &
pid=$!
"$kiln" health --wait 20 || fail "kilnd did not become healthy"
[[ -S $work/run/kiln/kilnd.sock ]] || fail "no socket at the default per-user path"
[[ $(stat -c %a "$work/run/kiln") == 700 ]] || fail "socket directory is not private"

head -c 300000 /dev/urandom >"$work/k.cubin"
echo '{"name": "k"}' >"$work/k.json"
"$kiln" put triton key1 k.cubin="$work/k.cubin" k.json="$work/k.json" || fail "put"
"$kiln" get triton key1 -o "$work/out" >/dev/null || fail "get"
cmp "$work/k.cubin" "$work/out/k.cubin" || fail "cubin differs after a round trip"
set +e
"$kiln" get triton absent >/dev/null 2>&1; miss=$?
"$kiln" put 'Bad NS' key1 k.json="$work/k.json" 2>"$work/badput.err"; bad=$?
set -e
[[ $miss == 1 ]] || fail "a miss exits $miss, not 1"
[[ $bad == 2 ]] || fail "an invalid namespace exits $bad, not 2"
grep -q namespace "$work/badput.err" || fail "invalid namespace error does not say so"
"$kilnd" --stats | grep -q "1 hits, 1 misses" || fail "stats do not count the lookups"

# A second kilnd on the same data directory refuses to start.
if "$kilnd" --local-socket="$work/other.sock" 2>"$work/second.err"; then
  fail "a second kilnd started on the same data dir"
fi
grep -q "another kilnd" "$work/second.err" || fail "second instance error is unclear"

kill -TERM "$pid"
wait "$pid" || fail "kilnd exited non-zero after SIGTERM"
pid=
grep -q "stopped cleanly" "$work/kilnd.out" || fail "no clean-stop message"
[[ ! -e $work/run/kiln/kilnd.sock ]] || fail "socket left behind"
[[ $(sqlite3 "$work/cache/kiln/kiln.db" "PRAGMA integrity_check") == ok ]] || fail "integrity"
grep -q "serving on" "$work/cache/kiln/logs/kilnd.log" || fail "no rotating log file"

# After a restart the entry is still there.
"$kilnd" >"$work/kilnd2.out" 2>&1 &
pid=$!
"$kiln" health --wait 20 || fail "kilnd did not restart"
"$kiln" get triton key1 >/dev/null || fail "entry lost across restart"
kill -TERM "$pid"; wait "$pid"; pid=
passed=1
echo "kilnd process test: PASS"

#!/usr/bin/env bash
# The systemd units in deploy/linux: `systemd-analyze verify` accepts them, and
# kilnd started with the user unit's ExecStart and environment is reachable by
# a client at the default per-user socket.
# usage: systemd_units_test.sh KILND KILN
set -euo pipefail
kilnd=$(realpath "$1")
kiln=$(realpath "$2")
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/kiln-units.XXXXXX)
pid=
trap '[[ -n $pid ]] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT

if command -v systemd-analyze >/dev/null; then
  for unit in kilnd.user.service kilnd.system.service kilnd.farm.service; do
    # verify resolves ExecStart: point it at the binary under test.
    sed "s|/usr/local/bin/kilnd|$kilnd|" "$root/deploy/linux/$unit" >"$work/kilnd.service"
    if ! out=$(systemd-analyze verify "$work/kilnd.service" 2>&1); then
      echo "FAIL: $unit: $out"; exit 1
    fi
    # Warnings about the missing kiln user or a non-booted system are not the unit's fault.
    if grep -v -e "kiln" -e "System has not been booted" -e "Failed to connect" <<<"$out" | grep -qi "error"; then
      echo "FAIL: $unit: $out"; exit 1
    fi
  done
else
  echo "systemd-analyze not installed: unit verification skipped"
fi

# What systemd --user provides: XDG_RUNTIME_DIR (%t) and HOME (%h).
export HOME=$work/home XDG_RUNTIME_DIR=$work/run
unset XDG_CACHE_HOME XDG_CONFIG_HOME KILN_ENDPOINT
mkdir -p "$HOME" && mkdir -m 700 "$XDG_RUNTIME_DIR"
exec_start=$(sed -n 's/^ExecStart=//p' "$root/deploy/linux/kilnd.user.service")
[[ $exec_start == /usr/local/bin/kilnd ]] || { echo "FAIL: unexpected ExecStart $exec_start"; exit 1; }
"$kilnd" >"$work/kilnd.log" 2>&1 &
pid=$!
"$kiln" health --wait 20 || { cat "$work/kilnd.log"; echo "FAIL: not reachable"; exit 1; }
[[ -d $HOME/.cache/kiln ]] || { echo "FAIL: the unit's ReadWritePaths (%h/.cache/kiln) is not where kilnd writes"; exit 1; }
kill -TERM $pid; wait $pid; pid=
echo "systemd units test: PASS"

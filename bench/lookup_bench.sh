#!/usr/bin/env bash
# Lookup-hit latency and throughput of kilnd over its local socket, for a
# 20 KB and a 1 MB cubin-sized entry with 1 and 16 concurrent clients, beside
# stock Triton's warm file-cache hit for the same sizes measured in this run.
# Two ways to get the bytes: in the answer ("bytes", what remote clients and
# other accounts get), and as kilnd's served files that the client reads
# ("files", a local client's fast path).
#
# usage: bench/lookup_bench.sh [BUILD_DIR] [SECONDS_PER_CASE]
# Stock Triton is measured with $KILN_PYTHON (default .venv/bin/python, then
# python3) when it can import triton.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# None of this account's kilnd, caches or files (tests/hermetic.py).
[[ -n ${KILN_TEST_ROOT:-} ]] || exec python3 "$root/tests/hermetic.py" -- "$0" "$@"
build=${1:-$root/build}
seconds=${2:-3}
python=${KILN_PYTHON:-$root/.venv/bin/python}
[[ -x $python ]] || python=python3
work=$(mktemp -d /tmp/kiln-bench.XXXXXX)
"$build/service/kilnd" --data-dir "$work/data" --local-socket "$work/kilnd.sock" \
  --log-level warn >"$work/kilnd.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
"$build/client/cpp/kiln" --endpoint "unix:$work/kilnd.sock" health --wait 20 >/dev/null

have_triton=0
"$python" -c "import triton" 2>/dev/null && have_triton=1
echo "kilnd lookup hits over the local socket, ${seconds}s per case ($(nproc) cores)"
printf '%-9s %-8s %-6s | %-27s | %-27s | %s\n' size clients as \
  "kilnd p50 / p99 ms, hits/s" "stock triton p50/p99, hits/s" "p50 kilnd/stock"
for size in 20000 1000000; do
  for clients in 1 16; do
    stock="(triton not importable)"; s50=""
    if [[ $have_triton == 1 ]]; then
      read -r s50 s99 srate < <("$python" "$root/bench/triton_file_cache_lookup.py" \
        $size $clients "$seconds")
      stock=$(printf '%7s / %7s %8s' "$s50" "$s99" "$srate")
    fi
    for as_files in 0 1; do
      read -r _ _ _ _ p50 _ _ p99 _ _ rate _ < <("$build/bench/lookup_bench" \
        --endpoint "unix:$work/kilnd.sock" --size $size --clients $clients --seconds "$seconds" \
        --as-files $as_files)
      ratio="-"
      [[ -n $s50 ]] && ratio=$(awk -v a="$p50" -v b="$s50" 'BEGIN { printf "%.2fx", a / b }')
      printf '%-9s %-8s %-6s | %7s / %7s %9s | %-27s | %s\n' $size $clients \
        "$([[ $as_files == 1 ]] && echo files || echo bytes)" "$p50" "$p99" "$rate" "$stock" "$ratio"
    done
  done
done
"$build/client/cpp/kiln" --endpoint "unix:$work/kilnd.sock" stats | sed -n '1,3p'

#!/usr/bin/env bash
# scripts/build-windows-deps and its seeds, against the prefix this machine's
# cache already holds (scripts/test built or unpacked it; skipped where none
# is): --make-seed writes a seed of it, an empty cache takes that seed instead
# of building, and a damaged or mismatched seed, or none, is refused with one
# line saying why (--no-build stops there instead of a 20-minute build).
# Each case runs on an empty cache of its own, whose Debian source trees are
# the real cache's (read, never fetched again).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
script=$root/scripts/build-windows-deps
work=$(mktemp -d /tmp/kiln-seed.XXXXXX)
trap 'rm -rf "$work"' EXIT

if ! real=$("$script" --no-build 2>"$work/why"); then
  echo "no Windows dependency prefix in this machine's cache: $(cat "$work/why")"
  exit 77
fi
real=$(tail -1 <<<"$real")
name=$(basename "$real")
real_cache=$(dirname "$real")

fail() { echo "FAIL: $*"; exit 1; }

# A cache with nothing but the real one's sources; $1 names it.
empty_cache() {
  mkdir -p "$work/$1"
  ln -s "$real_cache/src" "$work/$1/src"
  echo "$work/$1"
}

# Runs the script with --no-build on cache $1 and seed directory $2: its
# status, and its output and errors in $work/out and $work/err.
run_on() {
  status=0
  KILN_WINDOWS_DEPS_CACHE=$1 KILN_WINDOWS_DEPS_SEED=$2 "$script" --no-build >"$work/out" 2>"$work/err" ||
    status=$?
}

"$script" --make-seed "$work/seeds" >/dev/null 2>"$work/err" || fail "--make-seed: $(cat "$work/err")"
[[ -f $work/seeds/$name.tar.gz ]] || fail "--make-seed wrote no $name.tar.gz: $(ls "$work/seeds")"

# An empty cache takes the seed, whole, and keeps it.
cache=$(empty_cache seeded)
run_on "$cache" "$work/seeds"
[[ $status -eq 0 ]] || fail "a matching seed was not taken: $(cat "$work/err")"
[[ $(tail -1 "$work/out") == "$cache/$name" ]] || fail "printed $(cat "$work/out"), not $cache/$name"
grep -q "unpacked the seed $work/seeds/$name.tar.gz" "$work/err" || fail "no line says the seed was taken"
diff <(cd "$real" && find . | sort) <(cd "$cache/$name" && find . | sort) >/dev/null ||
  fail "the unpacked prefix is not the seeded one"
run_on "$cache" "$work/nowhere"
[[ $status -eq 0 && ! -s $work/err ]] || fail "the unpacked prefix was not reused: $(cat "$work/err")"

# A seed cut short: refused, nothing of it left in the cache.
mkdir "$work/damaged"
head -c $(( $(stat -c %s "$work/seeds/$name.tar.gz") / 2 )) "$work/seeds/$name.tar.gz" \
  >"$work/damaged/$name.tar.gz"
cache=$(empty_cache damaged-cache)
run_on "$cache" "$work/damaged"
[[ $status -eq 3 ]] || fail "a damaged seed gave status $status: $(cat "$work/err")"
grep -q "the seed $work/damaged/$name.tar.gz is damaged" "$work/err" || fail "$(cat "$work/err")"
[[ ! -e $cache/$name && ! -e $cache/unpacking ]] || fail "a damaged seed left files: $(ls "$cache")"

# A seed under this key that lacks a library's stamp (made by another recipe,
# or by hand): refused.
mkdir -p "$work/partial/tree" "$work/mismatched"
tar -xzf "$work/seeds/$name.tar.gz" -C "$work/partial/tree"
rm "$work/partial/tree/$name/.built/grpc-"*
tar -C "$work/partial/tree" -czf "$work/mismatched/$name.tar.gz" "$name"
cache=$(empty_cache mismatched-cache)
run_on "$cache" "$work/mismatched"
[[ $status -eq 3 ]] || fail "a seed without gRPC's stamp gave status $status: $(cat "$work/err")"
grep -q "holds no complete $name with grpc" "$work/err" || fail "$(cat "$work/err")"
[[ ! -e $cache/$name ]] || fail "a mismatched seed was unpacked"

# No seed directory, and one without this key.
cache=$(empty_cache unseeded)
run_on "$cache" "$work/nowhere"
[[ $status -eq 3 ]] && grep -q "no seed directory $work/nowhere" "$work/err" || fail "$(cat "$work/err")"
mkdir "$work/other" && touch "$work/other/prefix-0123456789abcdef.tar.gz"
run_on "$cache" "$work/other"
[[ $status -eq 3 ]] && grep -q "no seed of key ${name#prefix-} in $work/other (it holds: prefix-0123456789abcdef.tar.gz" \
  "$work/err" || fail "$(cat "$work/err")"
echo "seeds: taken, reused, and refused when damaged, mismatched or missing"

#!/usr/bin/env bash
# The README's commands after a configure that failed: the build folder holds
# a CMakeCache.txt (here one naming another source folder and generator, as
# a failed first run can leave) and no build files. Plain cmake refuses such
# a cache; `make configure` (what `make test` and `make demo` run) must
# configure afresh.
#   check_stale_cache.sh SOURCE_DIR
set -euo pipefail
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
stale() {
  mkdir -p "$1"
  printf 'CMAKE_HOME_DIRECTORY:INTERNAL=/nonexistent/elsewhere\nCMAKE_GENERATOR:INTERNAL=Unix Makefiles\n' > "$1/CMakeCache.txt"
}
stale "$tmp/plain"
if cmake -S "$src" -B "$tmp/plain" > "$tmp/plain.log" 2>&1; then
  echo "FAIL: cmake accepted the stale cache, so this test proves nothing"; exit 1
fi
stale "$tmp/build"
if ! make -C "$src" configure BUILD="$tmp/build" CMAKE_FLAGS="-DBUILD_TESTING=OFF" > "$tmp/make.log" 2>&1; then
  tail -20 "$tmp/make.log"; echo "FAIL: make configure did not recover from the stale cache"; exit 1
fi
if [ ! -f "$tmp/build/build.ninja" ] && [ ! -f "$tmp/build/Makefile" ]; then
  echo "FAIL: no build files after make configure"; exit 1
fi
echo "OK: make configure replaced the stale cache ($(ls "$tmp/build" | tr '\n' ' '))"

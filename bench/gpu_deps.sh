#!/usr/bin/env bash
# The headers a GPU machine without Debian's packages lacks, into ./.deps for a
# device run to carry (configure with -DCMAKE_PREFIX_PATH="$PWD/.deps;<torch's>"):
# CLI11 and nlohmann/json with their CMake package files, and toml++'s headers
# (CMake finds those on the include path, header-only). From the repository root,
# on a machine with the packages (natively or in the trixie root, SPMD_ROOTFS):
#   bash bench/gpu_deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=""
[ -f /usr/include/toml++/toml.hpp ] || root=${SPMD_ROOTFS:-/var/lib/spmd/trixie}
for h in CLI nlohmann toml++; do
  [ -d "$root/usr/include/$h" ] || { echo "gpu_deps.sh: no $root/usr/include/$h: run make deps" >&2; exit 1; }
done
d=.deps
rm -rf "$d"; mkdir -p "$d/include" "$d/share/cmake"
cp -r "$root/usr/include/CLI" "$root/usr/include/nlohmann" "$root/usr/include/toml++" "$d/include/"
cp -r "$root/usr/share/cmake/CLI11" "$root/usr/share/cmake/nlohmann_json" "$d/share/cmake/"
# The packaged configs point at /usr/include; point them at the carried copy.
{ grep -rl "/usr/include" "$d/share/cmake" || true; } | xargs -r sed -i "s#/usr/include#\${CMAKE_CURRENT_LIST_DIR}/../../../include#g"
echo "ready: $d (carry it as .deps)"

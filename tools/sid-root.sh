#!/usr/bin/env bash
# A Debian unstable root with the Python libraries CI's trixie root lacks
# (transformers, torch 2.14, torchvision 0.27), for the sweep and the .pt2
# fixtures of a newer torch.export on a machine without a GPU. spmd's tools
# stay the trixie root's build: inside this root they are reached through
# wrappers (build/sid-bin/spmd-*) that run them in the trixie root, mounted
# at /trixie.
#
#   sid-root.sh deps          makes the root once (about 1 minute and 2 GB)
#   sid-root.sh run CMD...    runs CMD in it, in this project folder; the
#                             wrappers' folder is build/sid-bin
#
# The root lives in $SPMD_SID_ROOTFS (default /var/lib/spmd/sid); the trixie
# root in $SPMD_ROOTFS, as for platform.sh. Examples:
#
#   tools/sid-root.sh run python3 bench/sweep.py build/sid-bin OUT --tier families --jobs 2
#   tools/sid-root.sh run python3 tests/pt2/make_program_fixtures.py tests/pt2/fixtures vmap
set -euo pipefail

SID=${SPMD_SID_ROOTFS:-/var/lib/spmd/sid}
TRIXIE=${SPMD_ROOTFS:-/var/lib/spmd/trixie}
MIRROR=${SPMD_MIRROR:-http://deb.debian.org/debian}
PROJECT=$(cd "$(dirname "$0")/.." && pwd)
PACKAGES=python3-transformers,python3-torch,python3-torchvision,python3-numpy,git
TOOLS="spmd-expand spmd-split spmd-unroll spmd-lower spmd-run spmd-inspect"

die() { echo "sid-root.sh: error: $*" >&2; exit 1; }

make_root() {
  [ "$(id -u)" = 0 ] || die "making $SID needs root"
  [ -x "$SID/usr/bin/python3" ] && return
  command -v mmdebstrap > /dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
  rm -rf --one-file-system "$SID.part"
  mkdir -p "$(dirname "$SID")"
  # Unstable's Release file may be past its Valid-Until on a mirror snapshot.
  unshare --mount --propagation private -- mmdebstrap --variant=apt \
    --aptopt='Acquire::Check-Valid-Until "false"' --include="$PACKAGES" sid "$SID.part" "$MIRROR"
  mv "$SID.part" "$SID"
}

# build/sid-bin/TOOL runs TOOL inside the trixie root, in the caller's
# folder: build/TOOL as it was when the run began (a hard link in
# build/sid-bin/PID/, named by SPMD_SID_TOOLS, which a rebuild meanwhile
# leaves alone).
write_wrappers() {  # SNAPSHOT
  local snapshot=$1
  mkdir -p "$snapshot"
  for tool in $TOOLS; do
    ln -f "$PROJECT/build/$tool" "$snapshot/$tool" 2> /dev/null || cp "$PROJECT/build/$tool" "$snapshot/$tool"
    cat > "$PROJECT/build/sid-bin/$tool" << EOF
#!/bin/sh
exec /usr/sbin/chroot /trixie /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 \\
  OMP_NUM_THREADS="\${OMP_NUM_THREADS:-1}" sh -c 'cd "\$0" && exec "\$@"' "\$PWD" "\$SPMD_SID_TOOLS/$tool" "\$@"
EOF
    chmod +x "$PROJECT/build/sid-bin/$tool"
  done
}

run() {
  [ -x "$SID/usr/bin/python3" ] || die "no root in $SID: run 'tools/sid-root.sh deps' first"
  [ -x "$TRIXIE/usr/bin/apt-get" ] || die "no trixie root in $TRIXIE: run 'make deps' first"
  [ "$(id -u)" = 0 ] || die "entering $SID needs root"
  local snapshot="$PROJECT/build/sid-bin/$$"
  write_wrappers "$snapshot"
  local inner='
    set -e
    sid=$1; trixie=$2; project=$3; tools=$4; shift 4
    for r in "$sid" "$trixie"; do
      mount --rbind /dev "$r/dev"
      mount -t proc proc "$r/proc"
      mount --rbind /sys "$r/sys"
      mkdir -p "$r$project"
      mount --bind "$project" "$r$project"
    done
    mkdir -p "$sid/trixie"
    mount --rbind "$trixie" "$sid/trixie"
    exec chroot "$sid" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 SPMD_SID_TOOLS="$tools" \
      sh -c "cd \"\$0\" && exec \"\$@\"" "$project" "$@"
  '
  local status=0
  unshare --mount --propagation private -- sh -c "$inner" sh "$SID" "$TRIXIE" "$PROJECT" "$snapshot" "$@" || status=$?
  rm -rf "$snapshot"
  return $status
}

case "${1:-}" in
  deps) make_root ;;
  run) shift; run "$@" ;;
  *) die "usage: sid-root.sh deps | run CMD..." ;;
esac

#!/usr/bin/env bash
# Where spmd builds: natively on a Debian whose apt offers LibTorch 2.6 or
# later (trixie and newer), or else inside a Debian trixie root made once with
# mmdebstrap and reused. The Makefile calls it; it is usable by hand too.
#
#   platform.sh mode          prints "native" or "root"
#   platform.sh deps PKG...   installs what is missing: with apt natively, or
#                             into the trixie root (made first if absent or
#                             half-made)
#   platform.sh run CMD...    runs CMD inside the root, in this project folder
#                             (mounted at the same path), as the calling user
#
# The root lives in $SPMD_ROOTFS (default /var/lib/spmd/trixie). It is built in
# "$SPMD_ROOTFS.part" and renamed into place only when complete, so a root
# whose making was cut off is made again. Every mount is made inside a private
# mount namespace (unshare), so none outlives the command, even one killed.
set -euo pipefail

ROOTFS=${SPMD_ROOTFS:-/var/lib/spmd/trixie}
MIRROR=${SPMD_MIRROR:-http://deb.debian.org/debian}
MIN_TORCH=2.6
PROJECT=$(cd "$(dirname "$0")/.." && pwd)

die() { echo "platform.sh: error: $*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || die "$1 needs root (run make with sudo, or as root)"
}

# Version of a package: installed, or apt's candidate.
installed_version() { dpkg-query -W -f='${Status} ${Version}\n' "$1" 2>/dev/null | sed -n 's/^install ok installed //p'; }
candidate_version() { apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: //p' | grep -v '(none)' || true; }
at_least() { [ -n "$1" ] && dpkg --compare-versions "$1" ge "$MIN_TORCH"; }

# Native when this system's LibTorch is (or apt's would be) new enough; a
# Debian 13 (trixie) or later also counts before its apt lists are fetched.
mode() {
  if at_least "$(installed_version libtorch-dev)" || at_least "$(candidate_version libtorch-dev)"; then
    echo native; return
  fi
  local id="" version_id=""
  if [ -r /etc/os-release ]; then
    id=$(. /etc/os-release; echo "${ID:-}")
    version_id=$(. /etc/os-release; echo "${VERSION_ID:-}")
  fi
  if [ "$id" = debian ] && { [ -z "$version_id" ] || [ "${version_id%%.*}" -ge 13 ]; }; then
    echo native
  else
    echo root
  fi
}

missing_packages() {  # ROOT PKG...: those not installed in ROOT ("" = this system)
  local root=$1; shift
  for p in "$@"; do
    if [ -z "$root" ]; then dpkg -s "$p" >/dev/null 2>&1 || echo "$p"
    else chroot "$root" dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; fi
  done
}

host_install() {
  local missing
  missing=$(missing_packages "" "$@")
  [ -z "$missing" ] && return
  need_root "installing $(echo $missing)"
  echo "installing:" $missing
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
}

make_root() {  # PKG...
  need_root "making the trixie root $ROOTFS"
  host_install mmdebstrap
  local part="$ROOTFS.part"
  rm -rf --one-file-system "$part"
  mkdir -p "$(dirname "$ROOTFS")"
  echo "making a Debian trixie root in $ROOTFS (once; about 2 minutes and 2 GB)"
  local packages
  packages=$(echo "$@" | tr ' ' ',')
  unshare --mount --propagation private -- \
    mmdebstrap --variant=apt --include="$packages" trixie "$part" "$MIRROR"
  mv "$part" "$ROOTFS"
}

# Runs CMD in a private mount namespace with /dev, /proc, /sys, the host's DNS
# and this project mounted in the root.
in_namespace() {  # USERSPEC CMD...
  local userspec=$1; shift
  local inner='
    set -e
    r=$1; project=$2; userspec=$3; shift 3
    mount --rbind /dev "$r/dev"
    mount -t proc proc "$r/proc"
    mount --rbind /sys "$r/sys"
    touch "$r/etc/resolv.conf"
    mount --bind /etc/resolv.conf "$r/etc/resolv.conf"
    mkdir -p "$r$project"
    mount --bind "$project" "$r$project"
    exec chroot ${userspec:+--userspec="$userspec"} "$r" /usr/bin/env -i \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      HOME="${HOME_IN_ROOT:-/root}" LANG=C.UTF-8 TERM="${TERM:-dumb}" \
      sh -c "cd \"\$0\" && exec \"\$@\"" "$project" "$@"
  '
  HOME_IN_ROOT=$([ -n "$userspec" ] && echo /tmp || echo /root) \
    unshare --mount --propagation private -- sh -c "$inner" sh "$ROOTFS" "$PROJECT" "$userspec" "$@"
}

root_deps() {  # PKG...
  if [ ! -x "$ROOTFS/usr/bin/apt-get" ]; then
    make_root "$@"
    return
  fi
  local missing
  missing=$(missing_packages "$ROOTFS" "$@")
  [ -z "$missing" ] && return
  need_root "installing into $ROOTFS"
  echo "installing into $ROOTFS:" $missing
  in_namespace "" apt-get update
  in_namespace "" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
}

run() {
  [ -x "$ROOTFS/usr/bin/apt-get" ] || die "no trixie root in $ROOTFS: run 'make deps' first"
  need_root "entering the trixie root $ROOTFS"
  # Under sudo, build as the user who asked, so the build folder is theirs.
  local userspec=""
  if [ -n "${SUDO_UID:-}" ] && [ "${SUDO_UID}" != 0 ]; then userspec="$SUDO_UID:$SUDO_GID"; fi
  in_namespace "$userspec" "$@"
}

case "${1:-}" in
  mode) mode ;;
  deps) shift; if [ "$(mode)" = native ]; then host_install "$@"; else root_deps "$@"; fi ;;
  run) shift; run "$@" ;;
  *) die "usage: platform.sh mode | deps PKG... | run CMD..." ;;
esac

#!/usr/bin/env bash
# Build sandgym/base from Debian packages with no container registry:
# debootstrap (minbase) into a folder, then `docker import` it.
# Usage: images/build-base.sh [TAG] [SUITE] [MIRROR]
set -euo pipefail
tag=${1:-sandgym/base:latest}
suite=${2:-bookworm}
mirror=${3:-${SANDGYM_DEBIAN_MIRROR:-http://deb.debian.org/debian}}
command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install -y debootstrap" >&2; exit 1; }
root=$(mktemp -d /var/tmp/sandgym-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "[base] debootstrap $suite (minbase + python3) from $mirror" >&2
debootstrap --variant=minbase --include=python3,bash,ca-certificates,coreutils,procps \
  "$suite" "$root" "$mirror" >&2
# Keep the image small: no apt lists, docs or caches.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/usr/share/doc/* \
  "$root"/usr/share/man/* "$root"/usr/share/locale/*
echo "[base] docker import -> $tag" >&2
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' - "$tag" >&2
echo "$tag"

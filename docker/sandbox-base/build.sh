#!/usr/bin/env bash
# Build the offline sandbox base image harbor-rl/sandbox-base:bookworm (docs/design.md 8).
#
# Docker Hub is unreachable here, so the image is a debootstrapped Debian rootfs imported with
# `docker import`. Skips when the image already exists; the rootfs tarball is kept under
# $HARBOR_SANDBOX_BASE_CACHE (default /var/cache/harbor-rl) so a CI cache can restore it and the next run
# only re-imports it (seconds instead of a minute).
set -euo pipefail

IMAGE="${HARBOR_SANDBOX_BASE_IMAGE:-harbor-rl/sandbox-base:bookworm}"
SUITE="${HARBOR_SANDBOX_BASE_SUITE:-bookworm}"
MIRROR="${HARBOR_SANDBOX_BASE_MIRROR:-http://deb.debian.org/debian}"
CACHE_DIR="${HARBOR_SANDBOX_BASE_CACHE:-/var/cache/harbor-rl}"
PACKAGES="python3,python3-pytest,python3-venv,python3-pip,git,ca-certificates,procps,curl,bash,coreutils,findutils,grep,sed,gawk,diffutils,patch,less,file,make,tar,gzip,xz-utils,unzip"
# The tarball name carries a hash of what goes into it, so changing the package list rebuilds it.
RECIPE_HASH="$(printf '%s|%s|%s' "$SUITE" "$PACKAGES" "v1" | sha256sum | cut -c1-12)"
TARBALL="$CACHE_DIR/sandbox-base-$SUITE-$RECIPE_HASH.tar.gz"

if [[ "${1:-}" != "--force" ]] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "$IMAGE already exists; nothing to do (pass --force to rebuild)"
    exit 0
fi

import_tarball() {
    echo "importing $TARBALL as $IMAGE"
    gzip -dc "$TARBALL" | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["bash"]' \
        - "$IMAGE" >/dev/null
    echo "built $IMAGE"
}

if [[ -f "$TARBALL" && "${1:-}" != "--force" ]]; then
    import_tarball
    exit 0
fi

command -v debootstrap >/dev/null || { echo "debootstrap is not installed (apt-get install -y debootstrap)" >&2; exit 1; }
[[ "$(id -u)" == 0 ]] || { echo "debootstrap needs root" >&2; exit 1; }

mkdir -p "$CACHE_DIR"
ROOTFS="$(mktemp -d "${TMPDIR:-/tmp}/harbor-rl-rootfs.XXXXXX")"
trap 'rm -rf "$ROOTFS"' EXIT

echo "debootstrapping $SUITE into $ROOTFS (about a minute)"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 || {
    tail -30 "$ROOTFS.log" >&2
    exit 1
}
rm -f "$ROOTFS.log"
# Slim the image: apt caches and docs are not needed in a sandbox.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/share/doc/* \
    "$ROOTFS"/usr/share/man/*
mkdir -p "$ROOTFS/app" "$ROOTFS/logs" "$ROOTFS/tests"

# Write to a temp name first so an interrupted run never leaves a truncated cache entry.
tar --numeric-owner -C "$ROOTFS" -c . | gzip -1 >"$TARBALL.partial"
mv "$TARBALL.partial" "$TARBALL"
import_tarball

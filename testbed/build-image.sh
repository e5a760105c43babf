#!/usr/bin/env bash
# Builds the local test image that the container harness and the benchmark
# start Redis, MariaDB, PostgreSQL (alone and behind PgBouncer) and ZooKeeper
# from. Prints the image reference.
#
# The tag is a hash of this folder's contents, so an unchanged testbed reuses
# the image already built and any edit here gives a new one.
#
# Without a registry (the usual case on our machines) the root filesystem is
# made by mmdebstrap from this machine's own apt sources and turned into an
# image with `docker import`. With DLOCK_IMAGE_FROM_REGISTRY=1 the same
# packages are installed by the Dockerfile on debian:bookworm-slim instead.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
hash=$(cd "$here" && cat build-image.sh Dockerfile packages.txt bin/* | sha256sum | cut -c1-12)
image="dlock-testbed:$hash"

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi

packages=$(grep -v '^#' "$here/packages.txt" | xargs | tr ' ' ',')

# The same packages on debian:bookworm-slim, where a registry is reachable.
from_registry() {
  docker build -q -t "$image" "$here" >&2 && echo "$image"
}

if [ "${DLOCK_IMAGE_FROM_REGISTRY:-0}" = 1 ]; then
  from_registry
  exit
fi

# A fresh machine lacks mmdebstrap: install it when we can (root with apt),
# else build from a registry if one is reachable, else say in one sentence
# what to install.
if ! command -v mmdebstrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "build-image.sh: installing mmdebstrap with apt-get (needed to build the test image)" >&2
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq mmdebstrap; } >&2 ||
    echo "build-image.sh: could not install mmdebstrap with apt-get" >&2
fi
if ! command -v mmdebstrap >/dev/null; then
  echo "build-image.sh: mmdebstrap is missing; trying the Dockerfile (needs a registry)" >&2
  from_registry 2>/dev/null && exit 0
  echo "build-image.sh: cannot build the test image: install mmdebstrap (apt-get install -y mmdebstrap) or make a container registry reachable" >&2
  exit 1
fi

# Only the sources apt itself uses on this machine (enabled files), so no
# mirror is ever named in the repository.
sources() {
  [ -f /etc/apt/sources.list ] && grep -E '^\s*deb\s' /etc/apt/sources.list || true
  for f in /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && grep -E '^\s*deb\s' "$f" | grep -E '\sbookworm(-[a-z]+)?\s' || true
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && grep -q '^Suites:.*bookworm' "$f" && { cat "$f"; echo; } || true
  done
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

sources | mmdebstrap --quiet --variant=minbase --include="$packages" \
  --customize-hook="copy-in $(echo "$here"/bin/*) /usr/local/bin/" \
  --customize-hook='chmod 755 "$1"/usr/local/bin/dlock-*' \
  --customize-hook='chroot "$1" /usr/local/bin/dlock-init' \
  --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
  bookworm "$work/rootfs.tar" - >&2

docker import "$work/rootfs.tar" "$image" >/dev/null
echo "$image"

#!/usr/bin/env bash
# Builds a Debian root filesystem with mmdebstrap from the archive this host's apt uses, and imports it
# into podman as a base image for the Containerfiles here (no image registry needed; docs/deploy.md,
# "Container image"). The tarball is cached under CACHE_DIR, keyed by the suite, variant, package list
# and the sources file, so a rerun with the same inputs only imports it.
#
#   deploy/container/build-rootfs.sh KIND [IMAGE]     prints the image's name
#     build    compilers and toml++: Containerfile.switch's BUILD_IMAGE   (localhost/gradswitch-base:build)
#     runtime  libc and libstdc++ only: its RUNTIME_IMAGE                 (localhost/gradswitch-base:runtime)
#     python   Python 3, numpy, pip, libstdc++: a stand-in for Containerfile.worker's PyTorch BASE
#                                                                        (localhost/gradswitch-base:python)
#
# Environment: SUITE (default: the host's VERSION_CODENAME), SOURCES (default: the host's deb822 or
# one-line sources file), CACHE_DIR (default build/container). Needs root (mmdebstrap --mode=root).
set -euo pipefail
kind=${1:-}
case "$kind" in
  build) variant=apt packages=build-essential,cmake,ninja-build,pkg-config,libtomlplusplus-dev ;;
  runtime) variant=essential packages=libstdc++6 ;;
  python) variant=essential packages=python3,python3-numpy,python3-pip,libstdc++6 ;;
  *) echo "usage: $0 build|runtime|python [IMAGE]" >&2; exit 2 ;;
esac
image=${2:-localhost/gradswitch-base:$kind}
# shellcheck disable=SC1091
suite=${SUITE:-$(. /etc/os-release && echo "$VERSION_CODENAME")}
if [ -z "${SOURCES:-}" ]; then
  for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    [ -s "$f" ] && { SOURCES=$f; break; }
  done
fi
[ -n "${SOURCES:-}" ] || { echo "$0: no apt sources file found; set SOURCES" >&2; exit 2; }
cache=${CACHE_DIR:-build/container}
key=$( { echo "$suite $variant $packages"; cat "$SOURCES"; } | sha256sum | cut -c1-16)
tarball="$cache/rootfs-$key.tar"
mkdir -p "$cache"
if [ ! -s "$tarball" ]; then
  echo "==> mmdebstrap $suite ($variant${packages:+, $packages}) -> $tarball" >&2
  # mmdebstrap leaves the apt lists and caches out; documentation is left out too (smaller layers).
  mmdebstrap --mode=root --format=tar --variant="$variant" ${packages:+--include="$packages"} \
    --aptopt='Acquire::Languages "none"' --dpkgopt=force-unsafe-io --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$suite" "$tarball.part" "$SOURCES"
  mv "$tarball.part" "$tarball"
fi
echo "==> podman import $tarball $image" >&2
podman import --quiet "$tarball" "$image" >/dev/null
echo "$image"

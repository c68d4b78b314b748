#!/usr/bin/env bash
# Installs what gradswitch needs on a fresh Debian machine: build tools, DPDK, clang (fuzzing) and clang-format,
# network tools for the testbed, Open MPI, and the Python packages. Idempotent.
#   scripts/install-deps.sh           everything (tests)
#   scripts/install-deps.sh --minimal what the demo needs
set -euo pipefail
minimal=0
[ "${1:-}" = "--minimal" ] && minimal=1

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

apt_packages=(build-essential cmake ninja-build pkg-config python3-dev)
if [ $minimal -eq 0 ]; then
  apt_packages+=(libdpdk-dev dpdk clang clang-format libclang-rt-14-dev iproute2 nftables iputils-ping iperf3 ethtool
                 openmpi-bin libopenmpi-dev procps psmisc)
fi
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
pip_packages=("scikit-build-core>=0.10" "nanobind>=2.0" "numpy>=1.24")
if [ $minimal -eq 0 ]; then
  # torch is pinned: the CPU wheel of this version is what this project is tested with.
  pip_packages+=(pytest ruff "torch==2.13.0" mpi4py matplotlib scikit-learn)
fi
echo "==> pip install ${pip_packages[*]}"
$PY -m pip install -q --disable-pip-version-check "${pip_packages[@]}"

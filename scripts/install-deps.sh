#!/usr/bin/env bash
# Installs what gradswitch needs on a fresh Debian machine: build tools, DPDK, clang (fuzzing) and clang-format,
# network tools for the testbed, Open MPI, and the Python packages. Idempotent.
#   scripts/install-deps.sh           everything (tests)
#   scripts/install-deps.sh --minimal what the demo needs
#   --print-packages                  print the Debian packages it would install, and stop
set -euo pipefail
minimal=0
print=0
for arg in "$@"; do
  case "$arg" in
    --minimal) minimal=1 ;;
    --print-packages) print=1 ;;
    *) echo "usage: $0 [--minimal] [--print-packages]" >&2; exit 2 ;;
  esac
done

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

# The packages come from the table of every program gradswitch runs (scripts/programs.tsv, which
# tests/python/test_tools.py checks against the code): stage "build" for the demo, every row for tests.
table="$(dirname "$0")/programs.tsv"
mapfile -t apt_packages < <(awk -F'\t' -v all=$((1 - minimal)) \
  '!/^#/ && NF == 4 && (all || $3 == "build") { print $2 }' "$table" | sort -u)
if [ $print -eq 1 ]; then
  printf '%s\n' "${apt_packages[@]}"
  exit 0
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
  # the training frameworks the backend is tested under (tests/python/test_lightning.py,
  # test_accelerate.py), pinned to the versions tested with torch 2.13.0
  pip_packages+=("pytorch-lightning==2.6.6" "accelerate==1.15.0" "transformers==5.24.0")
  # Ray Train and torchft (tests/python/test_ray_train.py, test_torchft.py; docs/torch.md): releases
  # with wheels for this Python that accept torch 2.13.0, installed beside the pinned torch.
  pip_packages+=("ray[train]==2.60.0" "torchft==0.2.0")
  # torch's own distributed tests (tests/torch_upstream) import torch.testing._internal, which needs it.
  pip_packages+=("expecttest==0.3.0")
  # kubernetes-validate ships the Kubernetes API schemas (tests/python/test_deploy_kubernetes.py runs offline).
  pip_packages+=("kubernetes-validate==1.37.0")
fi
echo "==> pip install ${pip_packages[*]}"
$PY -m pip install -q --disable-pip-version-check "${pip_packages[@]}"

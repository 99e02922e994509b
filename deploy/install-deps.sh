#!/usr/bin/env bash
# Installs the Debian 12 packages psd needs, by purpose:
#   deploy/install-deps.sh run    build psd, psworker and psctl, and run them
#                                 (the quick start: Fashion-MNIST included)
#   deploy/install-deps.sh python all of run, and numpy and torch for the psd
#                                 Python package (quickstart.sh --python)
#   deploy/install-deps.sh test   all of run, and what tests/run.sh needs
#                                 (the default)
# Idempotent: when everything is present it checks with dpkg and exits at once.
# Runs as root, or through sudo for a normal user. Works on a bare Debian 12
# with nothing but apt-get; the CUDA toolkit is not a Debian package here, and
# without it the build leaves the CUDA backend out.
set -euo pipefail

# Building and running: compiler and build tools, the libraries the
# binaries link, and the data set the quick start trains on.
RUN_PKGS=(
  build-essential meson ninja-build pkg-config
  libzmq3-dev libprotobuf-c-dev protobuf-c-compiler
  libuv1-dev libopenblas-dev zlib1g-dev
  libjansson-dev libsystemd-dev libinih-dev libmicrohttpd-dev
  libcurl4-openssl-dev libsodium-dev
  python3
  dataset-fashion-mnist
)
# The psd Python package and its PyTorch integration, on Debian's python3.
PY_PKGS=(python3-numpy python3-torch)
# The tests: cmocka (unit and integration tests), clang and its sanitizer
# runtime (fuzz targets), procps (process checks), systemd
# (systemd-analyze verify of the units), prometheus (promtool) and curl
# (/metrics), iproute2, iptables and libnetfilter-queue (the several-host
# test in network namespaces), podman and debootstrap (the compose test),
# catatonit (the pause process of podman kube play's pods),
# numpy, pytest and torch (the Python package's tests, on Debian's python3),
# oneDNN (conv_bench compares psk's convolutions with it; nothing links it
# otherwise), PyYAML (the Kubernetes manifests' checker), etcd (the
# replicas' tests start one), pyzmq (a raw peer in those tests),
# matplotlib (tests/bench/size_bench.py's plots; the size-bench test
# checks they are drawn), libabigail (the abi test: libpsclient against
# its baseline), meson-python, build and venv (the wheel test builds the
# Python wheel and installs it into fresh venvs), mypy (the typing test
# checks the package's public API).
TEST_PKGS=(
  libcmocka-dev libdnnl-dev abigail-tools
  python3-numpy python3-pytest python3-torch python3-yaml python3-zmq python3-matplotlib
  python3-mesonpy python3-build python3-venv mypy
  clang libclang-rt-14-dev
  procps systemd
  prometheus curl
  iproute2 iptables libnetfilter-queue-dev
  podman podman-compose runc golang-github-containernetworking-plugin-dnsname debootstrap
  catatonit
  etcd-server
)

purpose=${1:-test}
case "$purpose" in
  run) PKGS=("${RUN_PKGS[@]}") ;;
  python) PKGS=("${RUN_PKGS[@]}" "${PY_PKGS[@]}") ;;
  test) PKGS=("${RUN_PKGS[@]}" "${TEST_PKGS[@]}") ;;
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "install-deps: '$purpose' is not run, python or test (see --help)" >&2; exit 2 ;;
esac

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages for '$purpose' present"
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi

echo "install-deps: installing for '$purpose': ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

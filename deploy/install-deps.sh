#!/usr/bin/env bash
# Installs every Debian package that psd's build, tests and quick start need.
# Idempotent: when everything is present it checks with dpkg and exits at once.
# Runs as root, or through sudo for a normal user. Works on a bare Debian 12
# with nothing but apt-get; the CUDA toolkit is not a Debian package here, and
# without it the build leaves the CUDA backend out.
set -euo pipefail

PKGS=(
  build-essential meson ninja-build pkg-config
  libzmq3-dev libprotobuf-c-dev protobuf-c-compiler
  libuv1-dev libopenblas-dev zlib1g-dev
  libcmocka-dev
  clang libclang-rt-14-dev
  python3 procps libjansson-dev
  libsystemd-dev libinih-dev systemd
  libmicrohttpd-dev prometheus curl
  iproute2 iptables libnetfilter-queue-dev
  podman podman-compose runc golang-github-containernetworking-plugin-dnsname debootstrap
  dataset-fashion-mnist
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

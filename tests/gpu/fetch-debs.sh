#!/usr/bin/env bash
# Downloads, on a Debian 12 machine, the Debian packages that
# tests/gpu/check.sh needs on a GPU host that has a compiler, nvcc, meson,
# ninja and Python but none of psd's libraries and no network:
# the -dev packages psd builds against, every library they need at run
# time (the closure apt computes, less the C and C++ runtimes the host
# has of its own), pkgconf, protobuf-c's compiler, cmocka (the test
# build) and the Fashion-MNIST data set.
# They land in tests/gpu/debs/ (ignored by git), with a list of what was
# fetched in debs/PACKAGES; about 58 MiB, 30 of them the data set. Carry that folder with the tree
# (for example the device tool's carry: ["tests/gpu/debs"]); check.sh
# unpacks it there with dpkg -x into a private prefix.
#   tests/gpu/fetch-debs.sh [--dir DIR] [--no-data]
# --no-data leaves the data set out (30 MiB): check.sh then skips the
# runs that train, unless the host has /usr/share/datasets/fashion-mnist.
# Needs apt-get and apt-cache with current lists (apt-get update once, as
# root); the download itself needs no root.
set -euo pipefail
cd "$(dirname "$0")"
dir=debs data=1
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=$2; shift 2 ;;
    --no-data) data=0; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fetch-debs: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for t in apt-get apt-cache dpkg-deb; do
  command -v "$t" >/dev/null || { echo "fetch-debs: '$t' not found: run this on Debian 12" >&2; exit 1; }
done
if [ -r /etc/os-release ] && ! grep -q '^VERSION_CODENAME=bookworm' /etc/os-release; then
  echo "fetch-debs: warning: this is not Debian 12 (bookworm); the packages are this system's" >&2
fi

# What psd links (meson.build's dependency() calls) and what builds it.
DEV=(libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libuv1-dev
  libopenblas-dev libopenblas-pthread-dev zlib1g-dev libjansson-dev
  libsystemd-dev libinih-dev libmicrohttpd-dev libcurl4-openssl-dev
  libsodium-dev libcmocka-dev pkgconf pkgconf-bin)
# Their run-time libraries; apt adds what those need.
RUNTIME=(libzmq5 libprotobuf-c1 libuv1 libopenblas0-pthread zlib1g libjansson4
  libsystemd0 libinih1 libinireader0 libmicrohttpd12 libcurl4 libsodium23
  libprotoc32 libprotobuf32 libpkgconf3 libcmocka0)
# The host's own: the C library and the compiler's runtimes must be the
# ones its loader and compiler came with.
HOST='^(libc6|libc6-dev|libgcc-s1|libstdc\+\+6|gcc-12-base)$'

closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances "${RUNTIME[@]}" |
  grep -v '^[ <]' | sort -u | grep -Ev "$HOST")
pkgs=$(printf '%s\n' "${DEV[@]}" $closure | sort -u)
if [ "$data" = 1 ]; then pkgs+=$'\n'dataset-fashion-mnist; fi

mkdir -p "$dir"
rm -f "$dir"/*.deb "$dir/PACKAGES"
n=$(printf '%s\n' "$pkgs" | wc -l)
echo "fetch-debs: downloading $n packages into tests/gpu/$dir" >&2
# shellcheck disable=SC2086
if ! (cd "$dir" && apt-get download $pkgs >/dev/null); then
  echo "fetch-debs: apt-get download failed (are the package lists current? apt-get update)" >&2
  exit 1
fi
for f in "$dir"/*.deb; do
  dpkg-deb -W --showformat='${Package} ${Version}\n' "$f"
done | sort >"$dir/PACKAGES"
got=$(wc -l <"$dir/PACKAGES")
if [ "$got" -ne "$n" ]; then
  echo "fetch-debs: asked for $n packages, got $got" >&2
  exit 1
fi
echo "fetch-debs: $got packages, $(du -sh "$dir" | cut -f1) in tests/gpu/$dir" >&2

#!/usr/bin/env bash
# Installs the Debian packages stoker needs to build, test and benchmark, when
# they are missing. Safe to run repeatedly; does nothing when all are present.
set -euo pipefail
pkgs=(gcc make clang libclang-rt-14-dev pkg-config
      libjpeg62-turbo-dev libspng-dev libxxhash-dev libzstd-dev libcurl4-openssl-dev
      python3-dev python3-numpy python3-pytest python3-pil python3-torch python3-torchvision
      mate-backgrounds)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"

#!/usr/bin/env bash
# Installs what stoker needs to build, test and benchmark, when it is missing:
#   - Debian packages (compilers, libraries, Python modules, pip/setuptools/venv
#     for `pip install .` and its test, nginx for the remote dataset tests,
#     python3-snappy for bench/bench_formats.py's Python Parquet reader;
#     node and npm only when no `node`/`npm` is on PATH);
#   - the npm packages of the test servers (tests/servers/package.json, pinned by
#     its package-lock.json: @20minutes/s3rver) into build/node, which git ignores.
# Safe to run repeatedly; quiet and offline when everything is present.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

pkgs=(gcc make clang clang-format libclang-rt-14-dev pkg-config
      libjpeg62-turbo-dev libspng-dev libxxhash-dev libsnappy-dev libzstd-dev zlib1g-dev libjansson-dev libcurl4-openssl-dev curl openssl
      python3-dev python3-numpy python3-pytest python3-pil python3-torch python3-torchvision
      python3-setuptools python3-wheel python3-pip python3-venv python3-snappy
      mate-backgrounds nginx)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Any node will do: s3rver 4.0.4 asks for >= 20, and Debian 12's 18.20 runs it
# (tests/py/test_servers.py passes with it); Debian's only when none is installed.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # The tests run nginx themselves, from a temporary prefix: installing the
    # package must not start (or fail to start, port 80 taken) the system
    # service. policy-rc.d answering 101 stops invoke-rc.d and deb-systemd-invoke
    # from starting anything; an existing policy is left as it is.
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
        $SUDO chmod 755 "$policy"
        made_policy=1
        trap '$SUDO rm -f "$policy"' EXIT
    fi
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [ $made_policy -eq 1 ]; then
        $SUDO rm -f "$policy"
        trap - EXIT
    fi
    # On a systemd machine the unit was enabled for the next boot: nothing of
    # stoker needs the system service, so keep it off when we installed it.
    if [[ " ${missing[*]} " == *" nginx "* ]] && [ -d /run/systemd/system ]; then
        $SUDO systemctl disable --now nginx >/dev/null 2>&1 || true
    fi
    echo "install-deps: done"
fi

# npm packages of the test servers. The stamp holds the hash of the lock file
# they were installed from: an unchanged lock with the package present means
# nothing to do (no network).
nodedir="$root/build/node"
lock="$root/tests/servers/package-lock.json"
want=$(sha256sum "$lock" | cut -d' ' -f1)
if [ "$(cat "$nodedir/.stamp" 2>/dev/null || true)" != "$want" ] ||
   [ ! -f "$nodedir/node_modules/@20minutes/s3rver/package.json" ]; then
    echo "install-deps: installing the test servers' npm packages into build/node"
    mkdir -p "$nodedir"
    cp "$root/tests/servers/package.json" "$lock" "$nodedir/"
    rm -f "$nodedir/.stamp"
    (cd "$nodedir" && npm ci --prefer-offline --no-audit --no-fund --loglevel=error \
        --engine-strict=false >/dev/null)
    echo "$want" >"$nodedir/.stamp"
fi

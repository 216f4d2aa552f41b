#!/usr/bin/env bash
# The README's main job: build everything, create the built-in default dataset
# (an ImageNet-like ImageFolder made from Debian's photographs) if it is
# missing, and run `stoker bench` on it with the imagenet-train pipeline.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
make -s -j2 MODE=release lib tools
DATA=${STOKER_DATA:-data/default}
if [ ! -d "$DATA" ]; then
    /usr/bin/python3 scripts/make-dataset.py "$DATA"
fi
echo
build/release/stoker bench "$DATA" --transform imagenet-train --batch-size 128 --epochs 2 "$@"

#!/usr/bin/env bash
# Retrains the shipped demo model from scratch and rewrites models/ (see models/README.md).
# Needs scripts/install-training-deps.sh and a release build of `folio`. About 35 minutes on
# 2 cores. Deterministic: the same seed and thread count give the same weights.
#   scripts/train_kjv/retrain.sh [out dir] [build dir]
set -euo pipefail
out=${1:-out/train_kjv}
build=${2:-build/release}
/usr/bin/python3 scripts/train_kjv/train.py --out-dir "$out" --steps 800 --eval-every 50
/usr/bin/python3 scripts/train_kjv/package.py "$out" "$build/apps/folio/folio" .

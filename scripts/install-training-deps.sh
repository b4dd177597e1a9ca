#!/usr/bin/env bash
# Installs, from Debian packages, what retraining the demo model needs (scripts/train_kjv/,
# models/README.md): the King James Bible text and its `bible` program, PyTorch,
# SentencePiece, matplotlib and a threaded BLAS. Not needed to build, test or run Folio: CI
# uses only the shipped files in models/. Idempotent, like install-deps.sh.
set -euo pipefail
source "$(dirname "$0")/debian-packages.sh"

packages=(bible-kjv bible-kjv-text python3-torch python3-sentencepiece python3-matplotlib
  libopenblas0-pthread)

install_debian_packages install-training-deps "${packages[@]}"

#!/usr/bin/env bash
# Installs, from Debian packages, what retraining the demo model needs (scripts/train_kjv/,
# models/README.md): the King James Bible text and its `bible` program, PyTorch,
# SentencePiece, matplotlib and a threaded BLAS. Not needed to build, test or run Folio: CI
# uses only the shipped files in models/. Idempotent, like install-deps.sh.
set -euo pipefail

packages=(bible-kjv-text python3-torch python3-sentencepiece python3-matplotlib
  libopenblas0-pthread)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-training-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-training-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

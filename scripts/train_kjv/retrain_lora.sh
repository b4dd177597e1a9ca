#!/usr/bin/env bash
# Trains the demo model's three LoRA adapters (Psalms, Proverbs, the Gospels) from the shipped
# models/demo/kjv-f16.gguf and rewrites models/lora/ (see "LoRA adapters" in models/README.md).
# Needs scripts/install-training-deps.sh. Writes the adapter GGUFs too when the `folio` of the
# build directory has `make-adapter`; otherwise only the held-out texts and the record, and the
# interchange directories stay in the out dir for later conversion. About 10 minutes on one
# shared core. Deterministic: the same seed and thread count give the same adapters.
#   scripts/train_kjv/retrain_lora.sh [out dir] [build dir]
set -euo pipefail
out=${1:-out/lora}
build=${2:-build/release}
for part in psalms proverbs gospels; do
  /usr/bin/python3 scripts/train_kjv/train_lora.py --part "$part" --out-dir "$out"
done
folio="$build/apps/folio/folio"
# (`folio make-adapter --help` exits 0 even without the subcommand: CLI11 prints folio's help.)
commands=$("$folio" --help 2>/dev/null || true)
if grep -q '^  make-adapter ' <<<"$commands"; then
  /usr/bin/python3 scripts/train_kjv/package_lora.py "$out" --folio "$folio" .
else
  echo "retrain_lora: $folio has no make-adapter; writing the records only" >&2
  /usr/bin/python3 scripts/train_kjv/package_lora.py "$out" .
fi

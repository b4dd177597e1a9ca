#!/usr/bin/env bash
# Fuzzes the GGUF reader, and the Llama shape and tokenizer built from what it reads, with
# libFuzzer under AddressSanitizer and UndefinedBehaviorSanitizer.
#
#   scripts/fuzz-gguf.sh [SECONDS]     (default 60, shared by the two fuzz targets)
#
# Configures a separate clang build in build/fuzz, builds fuzz/gguf_reader_fuzzer (the format
# layer alone) and fuzz/model_file_fuzzer (shape and tokenizer), writes a seed corpus (small
# generated models, a BPE vocabulary, every metadata type, and truncations of each), then fuzzes
# each target for half of SECONDS over one corpus, which grows in build/fuzz/corpus across runs.
# Exits non-zero when a fuzzer finds a crash, a leak or a hang; the input that caused it is saved
# under build/fuzz/artifacts/ and can be replayed with:
#   build/fuzz/fuzz/gguf_reader_fuzzer build/fuzz/artifacts/crash-...
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build/fuzz"
jobs="${FOLIO_FUZZ_BUILD_JOBS:-2}"

if ! command -v clang++ >/dev/null; then
  echo "fuzz-gguf: clang++ is required (libFuzzer ships with clang)" >&2
  exit 2
fi

sanitizers="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="-O1 -g -fno-omit-frame-pointer -DFOLIO_DEBUG_CHECKS=1 $sanitizers" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DFOLIO_BUILD_FUZZERS=ON -DFOLIO_BUILD_TESTS=OFF -DFOLIO_BUILD_BENCHMARKS=OFF \
  -DFOLIO_ENABLE_CUDA=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target gguf_reader_fuzzer model_file_fuzzer gguf_seed_corpus

seeds="$build/seeds"
corpus="$build/corpus"
artifacts="$build/artifacts"
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus" "$artifacts"
"$build/fuzz/gguf_seed_corpus" "$seeds"

half=$(( (seconds + 1) / 2 ))
for fuzzer in gguf_reader_fuzzer model_file_fuzzer; do
  echo "fuzz-gguf: fuzzing $fuzzer for ${half} s"
  # New inputs go to the first directory (the corpus); the seeds are read only.
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
    "$build/fuzz/$fuzzer" "$corpus" "$seeds" \
    -max_total_time="$half" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -dict="$root/fuzz/gguf.dict" -artifact_prefix="$artifacts/" -print_final_stats=1
done
echo "fuzz-gguf: no crash in ${seconds} s"

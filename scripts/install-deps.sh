#!/usr/bin/env bash
# Installs, from Debian packages, exactly what Folio's build and tests need (and, with npm, the
# OpenAI Node.js client the server's end-to-end test uses). Idempotent: when
# every package is already installed it changes nothing and touches no network.
set -euo pipefail
source "$(dirname "$0")/debian-packages.sh"

packages=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev libspdlog-dev
  libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libssl-dev
  libopenblas-dev libopenblas0-pthread
  nlohmann-json3-dev libboost-dev libcpp-httplib-dev libcli11-dev
  clang libclang-rt-14-dev
  python3 python3-matplotlib
)

# The OpenAI Node.js client for the server's end-to-end test (tests/server/openai_node), pinned
# by its package-lock.json; only where node and npm exist (the test skips without it).
install_node_packages() {
  local folder
  folder="$(dirname "$0")/../tests/server/openai_node"
  if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    if [ ! -d "$folder/node_modules/openai" ] || [ ! -d "$folder/node_modules/openai-6" ]; then
      echo "install-deps: npm ci in tests/server/openai_node"
      (cd "$folder" && npm ci --no-audit --no-fund)
    fi
  else
    echo "install-deps: node/npm not found; the OpenAI Node.js end-to-end test will be skipped"
  fi
}

install_debian_packages install-deps "${packages[@]}"
install_node_packages

#!/usr/bin/env bash
# Installs, from Debian packages, exactly what Folio's build and tests need (and, with npm, the
# OpenAI Node.js client the server's end-to-end test uses). Idempotent: when
# every package is already installed it changes nothing and touches no network.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev libspdlog-dev
  libopenblas-dev libopenblas0-pthread
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev
  clang libclang-rt-14-dev
)

# The OpenAI Node.js client for the server's end-to-end test (tests/server/openai_node), pinned
# by its package-lock.json; only where node and npm exist (the test skips without it).
install_node_packages() {
  local folder
  folder="$(dirname "$0")/../tests/server/openai_node"
  if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    if [ ! -d "$folder/node_modules/openai" ]; then
      echo "install-deps: npm ci in tests/server/openai_node"
      (cd "$folder" && npm ci --no-audit --no-fund)
    fi
  else
    echo "install-deps: node/npm not found; the OpenAI Node.js end-to-end test will be skipped"
  fi
}

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  install_node_packages
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
install_node_packages

#!/usr/bin/env bash
# Installs everything moeserve builds and tests against on a fresh Debian 12 machine, then
# builds it (CPU backend always; CUDA backend too when nvcc is on the PATH or in /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake pkg-config git ca-certificates \
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libpcre2-dev libutf8proc-dev \
  libgtest-dev libgmock-dev libbenchmark-dev >/dev/null
# Node.js for the test peers: Debian's when the machine has none (a machine that ships its
# own Node.js, with npm inside, conflicts with Debian's npm package).
if ! command -v npm >/dev/null; then
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
# Test peers (real clients and reference implementations) from the npm registry.
if [ -f tests/peers/package.json ]; then
  npm ci --prefix tests/peers --no-audit --no-fund --loglevel=error
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"

#!/bin/bash
# Fills .deps (run here, from the repository root, before carrying it to the GPU machine) with the
# Debian packages the build needs there: ../shared/scripts/device-deps.sh's list and what
# cpp-httplib's pkg-config file names beside it (brotli, OpenSSL, zlib) with its shared library.
# Without those the configure on the GPU machine stops at cpp-httplib (BENCHMARKS, sessions 12, 34).
set -euo pipefail
rm -rf .deps
exec ../shared/scripts/device-deps.sh .deps libbrotli-dev libbrotli1 libssl-dev zlib1g-dev libcpp-httplib0.11 libssl3 \
  zlib1g

#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), from the repository root: the CUDA tests and/or the
# issue-6 benchmarks, with logs under $OUT. Binaries are taken from BIN when it holds them (an
# earlier call on the same machine), else built from the source tree SRC (a carried
# `git archive HEAD`, so that uncommitted work in the checkout stays out) into BIN.
#   bench/cuda_device_run.sh SRC BIN tests|ceilings|bench-qwen|bench-v2lite ...
set -uo pipefail
SRC=$1 BIN=$2; shift 2
OUT=${OUT:-/tmp/out}
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
# The tests find the fixtures at the absolute path they were built with: SRC/tests/fixtures.
[ -e "$SRC/tests/fixtures" ] || ln -s "$PWD/tests/fixtures" "$SRC/tests/fixtures"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
if [ ! -x "$BIN/moeserve" ]; then
  # The carried Debian packages (.deps) keep their /usr prefix in the pkg-config files.
  command -v pkg-config > /dev/null || export PATH=$PATH:$PWD/.deps/usr/bin
  sed -i "s|^prefix=/usr\$|prefix=$PWD/.deps/usr|" .deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc .deps/usr/share/pkgconfig/*.pc
  export PKG_CONFIG_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu/pkgconfig:$PWD/.deps/usr/share/pkgconfig
  cmake -S "$SRC" -B /tmp/build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCMAKE_PREFIX_PATH=$PWD/.deps/usr -DCMAKE_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu \
    > "$OUT/build.log" 2>&1
  cmake --build /tmp/build -j16 --target moeserve test_cuda_ops test_cuda_attention_moe test_cuda_fixtures \
    ms_cuda_ceilings >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  mkdir -p "$BIN"
  cp /tmp/build/moeserve /tmp/build/ms_cuda_ceilings /tmp/build/tests/test_cuda_* $BIN/
fi
bench() {  # model batch input output
  echo "== $1 B=$2 I=$3 O=$4" | tee -a "$OUT/bench.log"
  timeout 300 "$BIN/moeserve" bench-one-batch --model-path "$1" --device cuda --batch-size "$2" --input-len "$3" \
    --output-len "$4" --result-file "$OUT/bench.jsonl" 2>&1 | tee -a "$OUT/bench.log"
}
for stage in "$@"; do
  case $stage in
    tests)
      for t in test_cuda_ops test_cuda_attention_moe test_cuda_fixtures; do
        echo "===== $t" >> "$OUT/tests.log"
        timeout 400 "$BIN/$t" >> "$OUT/tests.log" 2>&1; echo "$t rc=$?"
      done
      grep -E "FAILED|Failure|error|Error|\[ fixture|PASSED|SKIPPED \]" "$OUT/tests.log" | head -80 ;;
    ceilings) timeout 120 "$BIN/ms_cuda_ceilings" 2>&1 | tee "$OUT/ceilings.json" ;;
    bench-qwen)
      timeout 300 "$BIN/moeserve" make-random-model --shape qwen3-30b-a3b --layers 12 /tmp/qwen3 > /dev/null
      cp /tmp/qwen3/config.json "$OUT/qwen3-config.json"; bench /tmp/qwen3 1 4096 8; bench /tmp/qwen3 8 1024 8; bench /tmp/qwen3 64 256 8; rm -rf /tmp/qwen3 ;;
    bench-v2lite)
      timeout 300 "$BIN/moeserve" make-random-model --shape deepseek-v2-lite --layers 9 /tmp/v2lite > /dev/null
      cp /tmp/v2lite/config.json "$OUT/v2lite-config.json"; bench /tmp/v2lite 1 4096 8; bench /tmp/v2lite 8 1024 8; bench /tmp/v2lite 64 256 8; rm -rf /tmp/v2lite ;;
  esac
done

# Sourced by the bench/cuda_*_run.sh scripts on the GPU machine, from the repository root: the
# carried Debian packages (.deps) on the library and pkg-config paths (their .pc files keep a
# /usr prefix, rewritten here), NVLink multicast off, and a timed `log` into $OUT/summary.log.
OUT=${OUT:-/tmp/out}
ROOT=$PWD
export LD_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.log"; }
# The layout every session script shares: logs in $L, builds and random models under .b4/ (ignored;
# a warm machine reuses them), this tree's build linked as /tmp/b with $B its moeserve, and left():
# the seconds of $BUDGET still to spend. $L starts empty: a warm machine keeps the last call's logs,
# and run_gpu_tests skips a test whose log is there.
L=/tmp/logs BUDGET=${BUDGET:-565} B=/tmp/b/moeserve
rm -rf $L && mkdir -p $L .b4/models .b4/after && ln -sfn $ROOT/.b4/after /tmp/b
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
command -v pkg-config > /dev/null || export PATH=$PATH:$ROOT/.deps/usr/bin
sed -i "s|^prefix=/usr\$|prefix=$ROOT/.deps/usr|" .deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc .deps/usr/share/pkgconfig/*.pc
export PKG_CONFIG_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu/pkgconfig:$ROOT/.deps/usr/share/pkgconfig

# A Release build of the source snapshot $1 into $2 for sm_90a against the carried packages.
configure_tree() {
  cmake -S $1 -B $2 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCMAKE_PREFIX_PATH=$ROOT/.deps/usr -DCMAKE_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu
}
# The GPU test programs of snapshot $1 (tests/kernels/test_*.cpp).
gpu_tests_of() { (cd $1/tests/kernels && ls test_*.cpp | sed 's/\.cpp$//' | tr '\n' ' '); }
# Runs build $1's single-GPU tests named after it, logs in $L, verdicts and failures in summary.log.
run_gpu_tests() {
  local build=$1 t; shift
  for t in "$@"; do
    case $t in test_cuda_parallel|test_nccl_comm) continue ;; esac
    [ -e $L/$t.log ] && continue
    timeout 200 $build/tests/$t > $L/$t.log 2>&1
    log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $L/$t.log | tr '\n' ' ')"
    grep -E '^\[  FAILED|Failure|Expected|Which is|actual|^\[ graphs \]' $L/$t.log | head -12 >> "$OUT/summary.log"
  done
}
# `generate` on deepseek-v3-tiny (three prompts, CUDA graphs) with 1..4 MTP draft steps against the
# plain run, with binary $1; $GEN is the plain command afterwards.
spec_vs_plain() {
  printf '%s\n' '{"input_ids":[5,17,3,99,410,7],"max_new_tokens":32,"ignore_eos":true}' \
    '{"input_ids":[11,12,13],"max_new_tokens":24,"ignore_eos":true}' \
    '{"input_ids":[1,2,3,4,5,6,7,8,9,10,11,12],"max_new_tokens":20,"ignore_eos":true}' > /tmp/p.jsonl
  GEN="$1 generate --device cuda --model-path tests/fixtures/deepseek-v3-tiny --max-total-tokens 4096 --input-file /tmp/p.jsonl"
  timeout 60 $GEN > /tmp/plain.txt 2> $L/plain.err
  local n rc same
  for n in 1 2 3 4; do
    timeout 60 $GEN --speculative-algorithm NEXTN --speculative-num-steps $n > /tmp/spec.txt 2> $L/spec_$n.err
    rc=$?; cmp -s /tmp/plain.txt /tmp/spec.txt && same=equal || same=DIFFER
    log "speculative steps=$n graphs rc=$rc ids $same plain; $(grep -o -i 'accept[^,]*' $L/spec_$n.err | head -1)"
  done
}
# Links the checkout's fixtures into each snapshot named (they are not in a snapshot) and notes the
# GPU in the summary: what every session script does first.
snapshots_ready() {
  local s
  for s in "$@"; do [ -e $s/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $s/tests/fixtures; done
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
}
# Links the fixtures into the snapshot $1 (and $2), notes the GPU, builds $1's moeserve,
# ms_cuda_ceilings and GPU tests into /tmp/b (TESTS: their names) and, meanwhile, $2's moeserve
# into /tmp/before when $2 is given; exits when the first build fails.
build_trees() {
  snapshots_ready "$@"
  local bb=""
  if [ $# -gt 1 ]; then
    (configure_tree $2 /tmp/before && cmake --build /tmp/before -j6 --target moeserve) > $L/build-before.log 2>&1 &
    bb=$!
  fi
  TESTS=$(gpu_tests_of $1)
  (configure_tree $1 /tmp/b && cmake --build /tmp/b -j12 --target moeserve ms_cuda_ceilings $TESTS) > $L/build.log 2>&1 ||
    { tail -40 $L/build.log; log "build failed"; exit 1; }
  log "built"
  [ -z "$bb" ] || { wait $bb; [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }; }
}
# bench-one-batch of the random model /tmp/$1 at each "B input output" given after it, with
# /tmp/before's and /tmp/b's moeserve, into $OUT/bench-{before,after}.jsonl; a log line each.
bench_before_after() {
  local name=$1 run b i o side bin; shift
  for run in "$@"; do
    read -r b i o <<< "$run"
    for side in before after; do
      bin=/tmp/b/moeserve; [ $side = before ] && bin=/tmp/before/moeserve
      echo "== $side $name B=$b I=$i O=$o" >> $L/bench.log
      timeout 120 $bin bench-one-batch --model-path /tmp/$name --device cuda --batch-size $b --input-len $i \
        --output-len $o --result-file "$OUT/bench-$side.jsonl" >> $L/bench.log 2>&1
      log "$side $name B=$b I=$i rc=$? $(grep -E 'Prefill\.|Decode\.  median' $L/bench.log | tail -2 | tr '\n' ' ')"
    done
  done
}
# $BEFORE_SRC's moeserve into /tmp/before, in the background ($! is its build), -j$1 (5). The caller
# defines $L (logs) and $B (its own moeserve), as for model().
build_before() {
  local jobs=${1:-5}; shift $(( $# > 0 ? 1 : 0 ))
  [ -e $BEFORE_SRC/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $BEFORE_SRC/tests/fixtures
  mkdir -p .b4/before; ln -sfn $ROOT/.b4/before /tmp/before
  (configure_tree $BEFORE_SRC /tmp/before && cmake --build /tmp/before -j$jobs --target moeserve "$@") > $L/build-before.log 2>&1 &
}
# $SRC's moeserve and the targets named into /tmp/b (-j$JOBS, 11); exits when moeserve did not build.
build_after() {
  configure_tree $SRC /tmp/b > $L/build.log 2>&1 && cmake --build /tmp/b -j${JOBS:-11} --target moeserve "$@" >> $L/build.log 2>&1
  log "built rc=$?"; [ -x $B ] || { tail -30 $L/build.log; exit 1; }
}
# Both random models made in the background (the caller's `wait` joins them) while /tmp/b's test
# programs named run.
models_beside_tests() {
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b "$@"
}
# $SRC's every GPU test program, ms_kernel_trace and ms_cuda_ceilings (build_after, -j$JOBS); both
# random models; the ceilings; every test run. Returns once every background job is done.
every_test_program() {
  build_after ms_kernel_trace ms_cuda_ceilings $(gpu_tests_of $SRC)
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  models_beside_tests $(gpu_tests_of $SRC)
  wait
}
# $SRC's moeserve, ms_kernel_trace, ms_cuda_ceilings and the test programs named (build_after, -j15), then
# both random models made while those programs run (models_beside_tests). Returns once all are done.
tests_and_models() {
  JOBS=15 build_after ms_kernel_trace ms_cuda_ceilings "$@"
  models_beside_tests "$@"
  wait
}
# B = 1 timelines of both models with env $1 ("VAR=v", labelled off) and without it (on).
timelines_off_on() {
  local m
  for m in qwen3 v2lite; do trace $m 1 4096 off "$1"; trace $m 1 4096 on; done
}
# A session's final tree, labelled `final`: every_test_program (-j15), B = 1 three rounds, B = 64,
# the 8k prefills, the engine's step (bench-offline) and the B = 1 timelines of both models: the
# figures of BENCHMARKS' "where the targets stand".
target_figures() {
  local m o
  JOBS=15 every_test_program
  b1_rounds final final
  SIDES=final bench_sides qwen3 "64 256 16" "1 8192 2"; SIDES=final bench_sides v2lite "64 256 16" "1 8192 2"
  for m in qwen3 v2lite; do for o in 16 528; do offline $m $o final-$m; done; done
  trace qwen3 1 4096 final; trace v2lite 1 4096 final
  log done
}
# $BEFORE_SRC's moeserve (build_before) beside every_test_program (-j11).
build_all_and_test() {
  build_before 5
  JOBS=11 every_test_program
}
# A test program under its own timeout ($2 s), logged as $L/$1.log, its verdicts and failures in summary.log.
gtest() {
  local tag=$1 secs=$2; shift 2
  timeout $secs "$@" > $L/$tag.log 2>&1
  log "$tag rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $L/$tag.log | tr '\n' ' ')"
  grep -E '^\[  FAILED|Failure|Expected|Which is|\[bench\]' $L/$tag.log | head -40 >> "$OUT/summary.log"
}
# The random model $1 (shape $2, $3 layers, then extra flags) made by $B into .b4/models unless
# there, linked as /tmp/$1; the caller defines $B, $L and left() (seconds of its budget left).
model() {
  local name=$1 shape=$2 layers=$3; shift 3
  [ -e .b4/models/$name/config.json ] || timeout $(( $(left) - 20 )) $B make-random-model --shape $shape --layers $layers \
    "$@" .b4/models/$name > $L/make-$name.log 2>&1
  log "model $name rc=$? $(du -sh .b4/models/$name | cut -f1)"
  ln -sfn $ROOT/.b4/models/$name /tmp/$name
}
# bench-one-batch of /tmp/$1 at each "B input output" after it, for each side in $SIDES
# ("name" or "name:VAR=v,--flag,...": the binary with those variables set and flags added; a
# value cannot hold a comma, which splits it: export such a variable around the call instead),
# /tmp/<name>/moeserve where there is one (before: build_before), else $B; results into ${RESULTS:-$OUT}/bench-<name>.jsonl.
# The caller defines $B, $L and left(), as for model().
bench_sides() {
  local name=$1 run b i o side label env flags bin w; shift
  for run in "$@"; do
    read -r b i o <<< "$run"
    for side in $SIDES; do
      [ $(left) -gt 25 ] || return
      label=${side%%:*} env="" flags=""
      if [ "$side" != "$label" ]; then
        for w in $(echo "${side#*:}" | tr ',' ' '); do case $w in --*) flags="$flags $w" ;; *) env="$env $w" ;; esac; done
      fi
      bin=$B; [ -x /tmp/$label/moeserve ] && bin=/tmp/$label/moeserve
      echo "== $label $name B=$b I=$i O=$o $flags" >> $L/bench.log
      env $env timeout $(( $(left) - 10 )) $bin bench-one-batch --model-path /tmp/$name --device cuda --batch-size $b \
        --input-len $i --output-len $o $flags --result-file "${RESULTS:-$OUT}/bench-$label.jsonl" >> $L/bench.log 2>&1
      log "$label $name B=$b I=$i rc=$? $(grep -E 'Prefill\.|Decode\.  median' $L/bench.log | tail -2 | tr '\n' ' ')"
    done
  done
}
# B = 1 at 4096 keys, three rounds: sides $1 then $2 for /tmp/qwen3, $2 then $1 for /tmp/v2lite
# (bench_sides' side syntax), so that neither side always runs first.
alternate_b1() {
  local r
  for r in 1 2 3; do SIDES="$1 $2" bench_sides qwen3 "1 4096 16"; SIDES="$2 $1" bench_sides v2lite "1 4096 16"; done
}
# The sides of $SIDES turned left by $1 (rounds rotate them, so that no side always runs first).
rotated() { local a=($SIDES) n; n=${#a[@]}; for ((k = 0; k < n; ++k)); do echo -n "${a[$(( (k + $1) % n ))]} "; done; }
# B = 1 at 4096 keys, three rounds: the sides $1 for /tmp/qwen3 and $2 for /tmp/v2lite (bench_sides'
# syntax), both turned left by the round.
b1_rounds() {
  local r
  for r in 0 1 2; do
    SIDES="$(SIDES="$1" rotated $r)" bench_sides qwen3 "1 4096 16"
    SIDES="$(SIDES="$2" rotated $r)" bench_sides v2lite "1 4096 16"
  done
}
# The engine's own decode of one 4096-token prompt (bench-offline: overlap scheduling, CUDA
# graphs), $2 new tokens, label $3, flags after it; the total time in summary.log
# (the exact durations: output tokens over output_throughput in the result file). Two lengths
# give the steady step: (T(long) - T(short)) / (long - short).
offline() {
  local m=$1 o=$2 tag=$3; shift 3
  timeout $(( $(left) - 10 )) $B bench-offline --model-path /tmp/$m --device cuda --num-prompts 1 \
    --random-input-len 4096 --random-output-len $o --random-range-ratio 1 --disable-tqdm \
    --result-filename $OUT/offline-$tag.jsonl "$@" > $L/offline-$tag-$m-$o.log 2>&1
  log "offline $tag $m out=$o rc=$? $(grep -E 'duration' $L/offline-$tag-$m-$o.log | tr -s ' ')"
}
# Kernel timeline (bench/kernel_trace.cpp: build ms_kernel_trace into /tmp/b) of /tmp/$1's graphed
# decode at B = $2, $3 keys, label $4, env after it; the median replay laid out in
# $L/kts-<label>-<model>-<B>.txt (bench/kernel_layer_increments.py reads it), its summary in summary.log;
# $TRACE_FLAGS: more flags for bench-one-batch.
trace() {
  local m=$1 b=$2 k=$3 tag=$4; shift 4
  env "$@" CUDA_INJECTION64_PATH=/tmp/b/libms_kernel_trace.so MS_KERNEL_TRACE=$L/kt-$tag-$m-$b.tsv timeout 60 $B \
    bench-one-batch --model-path /tmp/$m --device cuda --batch-size $b --input-len $k --output-len 16 ${TRACE_FLAGS:-} \
    > $L/kt-$tag-$m-$b.log 2>&1
  log "kernel trace $tag $m B=$b rc=$? $(grep -E 'Decode\.  median' $L/kt-$tag-$m-$b.log)"
  python3 $SRC/bench/kernel_trace_summary.py $L/kt-$tag-$m-$b.tsv --timeline 0 > $L/kts-$tag-$m-$b.txt 2>&1
  grep -E '^graph|median replay' $L/kts-$tag-$m-$b.txt | head -8 >> "$OUT/summary.log"
}
# The engine's own decode (bench-offline, one 4096-token prompt, $2 new tokens) of /tmp/$1 under the
# kernel tracer (ms_kernel_trace built into /tmp/b), label $3: the median replay and the gaps
# between replays in $L/kts-offline-<label>-<model>.txt.
trace_offline() {
  local m=$1 o=$2 tag=$3
  CUDA_INJECTION64_PATH=/tmp/b/libms_kernel_trace.so MS_KERNEL_TRACE=$L/kt-offline-$tag-$m.tsv offline $m $o trace-$tag
  python3 $SRC/bench/kernel_trace_summary.py $L/kt-offline-$tag-$m.tsv --timeline 0 > $L/kts-offline-$tag-$m.txt 2>&1
  grep -E '^graph|median replay' $L/kts-offline-$tag-$m.txt | head -4 >> "$OUT/summary.log"
}
# Greedy ids of /tmp/$1 for three prompts (CUDA graphs, overlap) with env $2 ("VAR=v" or "-"), by $B,
# into $L/gen-$3.txt, its checksum in summary.log.
gen_ids() {
  printf '%s\n' '{"input_ids":[5,17,3,99,410,7],"max_new_tokens":48,"ignore_eos":true}' \
    '{"input_ids":[11,12,13],"max_new_tokens":40,"ignore_eos":true}' \
    '{"input_ids":[1,2,3,4,5,6,7,8,9,10,11,12],"max_new_tokens":32,"ignore_eos":true}' > /tmp/p.jsonl
  local e=$2; [ "$e" = - ] && e=""
  env $e timeout 120 $B generate --device cuda --model-path /tmp/$1 --max-total-tokens 8192 --input-file /tmp/p.jsonl \
    > $L/gen-$3.txt 2> $L/gen-$3.err
  log "generate $1 $3 rc=$? $(md5sum < $L/gen-$3.txt | cut -c1-12) $(wc -c < $L/gen-$3.txt) bytes"
}
# Greedy ids (gen_ids) of both random models with env $1 against $2 ("-": none), labels $3 and $4;
# whether they are equal in summary.log.
ids_alike() {
  local m
  for m in qwen3 v2lite; do
    gen_ids $m "$1" $m-$3; gen_ids $m "$2" $m-$4
    cmp -s $L/gen-$m-$3.txt $L/gen-$m-$4.txt && log "generate $m ids equal" || log "generate $m ids DIFFER"
  done
}
# A session's closing figures, after (/tmp/b) against before (/tmp/before): greedy ids of both
# models, B = 1 rotating over sides $1 (Qwen3) and $2 (V2-Lite), B = 64, the engine's step.
before_after_figures() {
  local m o
  for m in qwen3 v2lite; do
    gen_ids $m - $m-after; B=/tmp/before/moeserve gen_ids $m - $m-before
    cmp -s $L/gen-$m-after.txt $L/gen-$m-before.txt && log "generate $m ids equal" || log "generate $m ids DIFFER"
  done
  b1_rounds "$1" "$2"
  SIDES="after before" bench_sides qwen3 "64 256 16"; SIDES="before after" bench_sides v2lite "64 256 16"
  for m in qwen3 v2lite; do
    for o in 16 528; do offline $m $o after-$m; B=/tmp/before/moeserve offline $m $o before-$m; done
  done
}

# The Nsight Compute binary, and the helpers of the prefill sessions (36-38).
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)

# Nsight Compute (full set, SASS stall samples) on the first launch of kernel regex $2 after $3 skipped in
# /tmp/${NCU_MODEL:-v2lite}'s 8k prefill (bench-one-batch), tag $1, env $NCU_ENV: details, raw metrics and the
# SASS lines' stall table (bench/ncu_sass_stalls.py) in $L.
ncu_prefill() {
  env ${NCU_ENV:-} timeout 200 $NCU --kernel-name-base demangled -k "regex:$2" --launch-skip ${3:-2} --launch-count 1 \
    --set full --import-source no -o $L/ncu-$1 $B bench-one-batch --model-path /tmp/${NCU_MODEL:-v2lite} --device cuda \
    --batch-size 1 --input-len 8192 --output-len 2 > $L/ncu-$1.log 2>&1
  ncu_export $1
}
# Report $L/ncu-$1.ncu-rep (its rc logged) as text in $L: details, raw metrics, SASS and the SASS lines' stall table
# (bench/ncu_sass_stalls.py, each kernel of the report in turn).
ncu_export() {
  log "ncu $1 rc=$?"
  $NCU -i $L/ncu-$1.ncu-rep --page details --csv > $L/ncu-$1-details.csv 2>&1
  $NCU -i $L/ncu-$1.ncu-rep --page raw --csv > $L/ncu-$1-raw.csv 2>&1
  $NCU -i $L/ncu-$1.ncu-rep --page source --print-source sass --csv > $L/ncu-$1-sass.csv 2>&1
  python3 $SRC/bench/ncu_sass_stalls.py $L/ncu-$1-sass.csv 60 > $L/ncu-$1-stalls.txt 2>&1
}
# The MLA prefill attention's bench (mla_expanded_attention on each wgmma variant of $1, comma-separated), tag $2.
mla_bench() {
  MOESERVE_BENCH_MLA_PREFILL=1 MOESERVE_MLA_EXPANDED_VARIANTS=$1 gtest $2 120 /tmp/b/tests/test_cuda_mla_prefill \
    --gtest_filter=CudaMlaPrefill.MlaExpandedAttentionBench
}
# The V3 EP8 shard (FP8 blocks, 32 experts) of $2 layers as /tmp/$1.
v3_model() { model $1 deepseek-v3 $2 --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32; }
# The opcode mix of the kernels in build $1's object $3.cu.o (grouped_gemm_fp8: the mma.sync kernels) by
# cuobjdump, tag $2, as $L/sass-$2.txt.
sass_mix() {
  local o; o=$(find $1/ -name "${3:-grouped_gemm_fp8}.cu.o" | head -1)
  PATH=$PATH:/usr/local/cuda/bin cuobjdump -sass $o > $L/sass-$2.sass 2>&1
  python3 - $L/sass-$2.sass > $L/sass-$2.txt <<'PY'
import re, sys, collections
fn, mix = None, collections.OrderedDict()
for line in open(sys.argv[1]):
    m = re.match(r'\s+Function : (\S+)', line)
    if m: fn = m.group(1); mix[fn] = collections.Counter(); continue
    m = re.match(r'\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)', line)
    if m and fn: mix[fn][m.group(2)] += 1
for fn, c in mix.items():
    if 'kernel' not in fn: continue
    print(fn, sum(c.values()), ' '.join(f'{k}:{v}' for k, v in c.most_common(14)))
PY
  log "sass $2: $(cut -c1-400 $L/sass-$2.txt | tr '\n' '|')"
}
# The grouped FP8 bench (V3's EP8 experts at $1's token counts, the dense FP8 linears) by /tmp/b's test
# program, then /tmp/before's (build_before with test_cuda_grouped_gemm_fp8), tags fp8-bench-<side>$2.
fp8_bench_both() {
  local s bin
  for s in after before; do
    bin=/tmp/b/tests/test_cuda_grouped_gemm_fp8; [ $s = before ] && bin=/tmp/before/tests/test_cuda_grouped_gemm_fp8
    MOESERVE_BENCH_FP8_GROUPED=1 MOESERVE_BENCH_FP8_TOKENS=$1 gtest fp8-bench-$s${2:-} 120 $bin --gtest_filter='*FP8GroupedBench'
  done
}
# Greedy ids of /tmp/v3-2 by $B and by /tmp/before/moeserve; whether they are equal in summary.log.
v3_ids_both() {
  gen_ids v3-2 - v3-after; B=/tmp/before/moeserve gen_ids v3-2 - v3-before
  cmp -s $L/gen-v3-after.txt $L/gen-v3-before.txt && log "generate v3 ids equal" || log "generate v3 ids DIFFER"
}

# Sourced by the bench/cuda_*_run.sh scripts on the GPU machine, from the repository root: the
# carried Debian packages (.deps) on the library and pkg-config paths (their .pc files keep a
# /usr prefix, rewritten here), NVLink multicast off, and a timed `log` into $OUT/summary.log.
OUT=${OUT:-/tmp/out}
ROOT=$PWD
export LD_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.log"; }
command -v pkg-config > /dev/null || export PATH=$PATH:$ROOT/.deps/usr/bin
sed -i "s|^prefix=/usr\$|prefix=$ROOT/.deps/usr|" .deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc .deps/usr/share/pkgconfig/*.pc
export PKG_CONFIG_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu/pkgconfig:$ROOT/.deps/usr/share/pkgconfig

#!/usr/bin/env bash
# polydev's CUDA check on a GPU machine, each part in one command (DEVELOPERS.md, "On a lent
# GPU machine"):
#
#   bash bench/gpu.sh prepare   here, with network: .gpu/ gets what the GPU machine lacks
#                               (wheels for its Python 3.12, llama-cpp-python's source without
#                               its model files), about 14 MiB
#   bash bench/gpu.sh           there: install; pytest -m cuda; polydev compare -b CUDA0 (and
#                               OpenCL0 where the driver offers one); bench/cuda_ops.py;
#                               bench/cuda_model.py (polydev alone); bench/serve.py on CUDA0
#   bash bench/gpu.sh tests     there: install; pytest -m cuda; polydev compare -b CUDA0 (the
#                               check alone, for a change of the CUDA backend's code: about
#                               half of the default part's time)
#   bash bench/gpu.sh models    there: install; every model architecture on CUDA0 against the
#                               CPU (pytest -m cuda tests/test_models_archs.py)
#   bash bench/gpu.sh llama     there: install; build llama.cpp's llama-bench with its CUDA
#                               backend (or unpack the build an earlier call saved in $OUT,
#                               carried back in .gpu/); then bench/cuda_model.py against it
#   bash bench/gpu.sh decode    there: install; the CUDA tests of the backend and its graphs;
#                               bench/cuda_model.py on the 1B-class Q4_K model with and without
#                               CUDA graphs (llama-bench beside it where .gpu carries a build);
#                               bench/cuda_profile.py (a decode step's time by op); compare's
#                               products and attention on CUDA0; bench/sched.py over CUDA0
#                               and the CPU (the scheduler's cost per split; about 5 minutes)
#   bash bench/gpu.sh threads   there: install; bench/threads.py (CPU thread scaling) against
#                               ../shared's portable llama-cpp-python wheel
#
# Through the device tool: run(command="bash bench/gpu.sh", carry=[".gpu"]), and the same with
# "bash bench/gpu.sh llama". Each part fits one call of 10 minutes: every step has a time limit
# of its own, and a step that fails or runs out is reported and the next one runs. Everything
# lands in $OUT (./gpu-out where OUT is unset): a log per step, compare's JSON lines, the
# benches' JSON and summary.txt, which is also printed. On a machine without an NVIDIA GPU the
# GPU parts stop at once with one line saying so.
set -uo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_VERSION=0.3.36
GPU_DIR=.gpu
SITE=/tmp/polydev-site             # what the parts install, on PYTHONPATH
LLAMA_DIR=/tmp/llama-cuda          # llama.cpp's llama-bench built for the GPU
LLAMA_BENCH=$LLAMA_DIR/bin/llama-bench
LLAMA_BENCH_ARCHIVE=llama-bench-cuda.tar.xz
CUDA_MODEL_ARGS=${CUDA_MODEL_ARGS:-}  # more options of bench/cuda_model.py (--quick, --only)
OUT=${OUT:-$PWD/gpu-out}
# a device call runs 600 s at most: end with time to spare (GPU_SECONDS: a shorter call)
DEADLINE=$((SECONDS + ${GPU_SECONDS:-570}))
# What the GPU machine's image lacks (its package list: the device tool's KINDS.md): the gguf
# package for the model files, pyopencl for its OpenCL check, diskcache for llama-cpp-python,
# a setuptools new enough for polydev's pyproject.toml, starlette and uvicorn for
# polydev serve (bench/serve.py), and regex for the tokenizers (the model tests import it).
GPU_WHEELS=(gguf diskcache "setuptools>=77" pyopencl pytools platformdirs siphash24 mako starlette
    uvicorn regex)
SHARED_LLAMA_WHEEL=../shared/wheels/llama_cpp_python-$LLAMA_CPP_VERSION-py3-none-linux_x86_64.whl
LLAMA_AVX2_DIR=/tmp/llama-cpp-avx2 # the shared wheel, installed there

say() { echo "gpu.sh: $*"; }
export -f say

# --- here: what travels --------------------------------------------------------------------------

prepare() {
    rm -rf "$GPU_DIR" && mkdir -p "$GPU_DIR/wheels" || return 1
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$GPU_DIR/wheels" "${GPU_WHEELS[@]}" || return 1
    local tmp
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" \
        "llama-cpp-python==$LLAMA_CPP_VERSION" || return 1
    tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp" || return 1
    # its vendored llama.cpp without what a build never reads (75 MiB of vocabularies, docs)
    local name="llama_cpp_python-$LLAMA_CPP_VERSION"
    tar czf "$GPU_DIR/$name.tar.gz" -C "$tmp" --exclude="$name/vendor/llama.cpp/models" \
        --exclude="$name/vendor/llama.cpp/docs" --exclude="$name/vendor/llama.cpp/benches" \
        --exclude=".git" --exclude=".github" "$name" || return 1
    rm -rf "$tmp"
    cp "$SHARED_LLAMA_WHEEL" "$GPU_DIR/" || return 1
    say "$GPU_DIR holds $(du -sh "$GPU_DIR" | cut -f1); run 'bash bench/gpu.sh' with it carried"
}

# --- there ---------------------------------------------------------------------------------------

require_gpu() {
    if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
        say "no NVIDIA GPU here (nvidia-smi lists none): run this on a GPU machine"
        exit 1
    fi
    [ -d "$GPU_DIR/wheels" ] || { say "no $GPU_DIR/wheels: run 'bash bench/gpu.sh prepare' \
where pip reaches PyPI, and carry $GPU_DIR"; exit 1; }
    mkdir -p "$OUT"
    export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
}

# step NAME SECONDS COMMAND: runs the shell command COMMAND (this script's functions
# included) for at most SECONDS and never past the DEADLINE, its output in $OUT/NAME.log
# unless it redirects it itself; one line in $OUT/steps.txt says how it ended.
step() {
    local name=$1 limit=$2 command=$3 start=$SECONDS rc how
    local left=$((DEADLINE - SECONDS))
    if [ "$left" -lt 20 ]; then
        echo "$name: not run, no time left" | tee -a "$OUT/steps.txt"
        return 1
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    say "$name (at most $limit s)"
    timeout --kill-after=10 "$limit" bash -c "$command" >>"$OUT/$name.log" 2>&1
    rc=$?
    how="exit $rc"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then how="stopped at its limit"; fi
    echo "$name: $how after $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
    # why, in the summary too: the last line the step wrote
    [ $rc -ne 0 ] && tail -1 "$OUT/$name.log" | sed 's/^/    /' >>"$OUT/steps.txt"
    return $rc
}

install_polydev() {
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
        "$GPU_DIR"/wheels/*.whl || return 1
    # built here: the CPU kernels for this machine's Python and processor
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" . \
        || return 1
    nvidia-smi
    python3 -m polydev.tools.cli devices -v
}

# The name of the first OpenCL device that is a GPU (the NVIDIA driver's, where it has one).
opencl_gpu() {
    python3 -m polydev.tools.cli devices --json 2>/dev/null | python3 -c 'import json, sys
names = [d["name"] for d in json.load(sys.stdin)["devices"]
         if d["backend"] == "OpenCL" and d["type"] != "CPU"]
print(names[0] if names else "")'
}

# The CUDA tests and the compare tool on CUDA0: what every change of the CUDA code must pass.
cuda_tests() {
    step tests 150 "python3 -m pytest -q -m cuda tests"
    step compare 150 "python3 -m polydev.tools.cli compare -b CUDA0 -j 4 --output json \
>'$OUT/compare.jsonl'"
}

tests() {
    require_gpu
    step setup 150 install_polydev || { summary; exit 1; }
    cuda_tests
    summary
}

check() {
    require_gpu
    step setup 150 install_polydev || { summary; exit 1; }
    cuda_tests
    local opencl
    opencl=$(opencl_gpu)
    if [ -n "$opencl" ]; then
        step compare_opencl 60 "python3 -m polydev.tools.cli compare -b $opencl -j 4 \
--output json >'$OUT/compare_opencl.jsonl'"
    else
        echo "compare_opencl: no OpenCL GPU here (polydev devices -v in setup.log says why)" \
            >>"$OUT/steps.txt"
    fi
    step cuda_ops 60 "python3 bench/cuda_ops.py --json >'$OUT/cuda_ops.json'"
    step cuda_model 180 "python3 bench/cuda_model.py --json --quick >'$OUT/cuda_model.json'"
    step serve 150 "python3 bench/serve.py --json --no-cpu --no-reference --no-opencl \
>'$OUT/serve.json'"
    summary
}

# The model architectures on CUDA0 against the CPU (tests/test_models_archs.py), for a change of
# the model layer: about a third of the tests part's time.
models() {
    require_gpu
    step setup 150 install_polydev || { summary; exit 1; }
    step tests 150 "python3 -m pytest -q -m cuda tests/test_models_archs.py"
    summary
}

threads() {
    require_gpu
    step setup 90 install_polydev || { summary; exit 1; }
    step llama_install 60 "python3 -m pip install -q --no-index --no-deps --no-compile \
--target '$LLAMA_AVX2_DIR' '$GPU_DIR'/llama_cpp_python-*.whl" || { summary; exit 1; }
    step threads 400 "python3 bench/threads.py --json --quick --llama-cpp '$LLAMA_AVX2_DIR' \
>'$OUT/threads.json'"
    summary
}

# llama.cpp's own C++ llama-bench with its CUDA backend, from the source llama-cpp-python
# vendors: for this machine's processor (GGML_NATIVE, the default) and the GPU's architecture
# (sm_90: H100, H200), kept outside the checkout. A build carried in $GPU_DIR (a later call
# of the same lease kind: bench/gpu.sh saves one in $OUT) is unpacked instead of built.
build_llama_bench() {
    if [ -x "$LLAMA_BENCH" ]; then say "llama-bench is built"; return 0; fi
    mkdir -p "$LLAMA_DIR/bin"
    if [ -f "$GPU_DIR/$LLAMA_BENCH_ARCHIVE" ]; then
        tar xJf "$GPU_DIR/$LLAMA_BENCH_ARCHIVE" -C "$LLAMA_DIR/bin" || return 1
        if "$LLAMA_BENCH" --help >/dev/null 2>&1; then
            say "llama-bench unpacked from $GPU_DIR/$LLAMA_BENCH_ARCHIVE"
            return 0
        fi
        say "the carried llama-bench does not run here: building it"
        rm -f "$LLAMA_BENCH"
    fi
    local tmp start=$SECONDS
    tmp=$(mktemp -d)
    tar xzf "$GPU_DIR"/llama_cpp_python-*.tar.gz -C "$tmp" || return 1
    cmake -S "$tmp"/llama_cpp_python-*/vendor/llama.cpp -B "$tmp/build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 || return 1
    cmake --build "$tmp/build" --target llama-bench -j "$(nproc)" || return 1
    cp "$tmp/build/bin/llama-bench" "$LLAMA_BENCH" || return 1
    say "built in $((SECONDS - start)) s"
    # for a later call: carry it back as $GPU_DIR/$LLAMA_BENCH_ARCHIVE
    XZ_OPT=-T0 tar cJf "$OUT/$LLAMA_BENCH_ARCHIVE" -C "$LLAMA_DIR/bin" llama-bench && ls -l "$OUT"
}

llama() {
    require_gpu
    step setup 200 install_polydev || { summary; exit 1; }
    step llama_build 330 build_llama_bench || { summary; exit 1; }
    step cuda_model 480 "python3 bench/cuda_model.py --json $CUDA_MODEL_ARGS \
--llama-bench '$LLAMA_BENCH' >'$OUT/cuda_model.json'"
    summary
}

# The decode step's figures after a change of its kernels or graphs, sized for a short call.
decode() {
    require_gpu
    step setup 120 install_polydev || { summary; exit 1; }
    step tests 60 "python3 -m pytest -q -m cuda -k 'not compare' tests/test_cuda.py"
    local anchor=""
    if [ -f "$GPU_DIR/$LLAMA_BENCH_ARCHIVE" ] && build_llama_bench >>"$OUT/setup.log" 2>&1; then
        anchor="--llama-bench '$LLAMA_BENCH'"
    fi
    step cuda_model 120 "python3 bench/cuda_model.py --json --quick --no-logits \
--only 'llama 1B-class Q4_K' --polydev-env POLYDEV_CUDA_GRAPHS=0 $anchor >'$OUT/cuda_model.json'"
    step profile 60 "python3 bench/cuda_profile.py 'llama 1B-class Q4_K'"
    step compare 60 "python3 -m polydev.tools.cli compare -b CUDA0 \
-o MUL_MAT,MUL_MAT_ID,FLASH_ATTN_EXT -j 4"
    step sched 90 "python3 bench/sched.py --device CUDA0 --json --quick >'$OUT/sched.json'"
    summary
}

# --- the summary ---------------------------------------------------------------------------------

summary() {
    {
        cat "$OUT/steps.txt"
        [ -f "$OUT/tests.log" ] && echo "tests: $(tail -1 "$OUT/tests.log")"
        [ -f "$OUT/compare.log" ] && echo "compare: $(grep -a 'Backend CUDA0' "$OUT/compare.log")"
        [ -f "$OUT/profile.log" ] && head -45 "$OUT/profile.log"
        for f in "$OUT"/compare*.jsonl; do
            [ -s "$f" ] && echo "$(basename "$f" .jsonl): $(grep '"summary"' "$f" | tail -1)"
        done
        for f in "$OUT"/cuda_ops.json "$OUT"/cuda_model.json "$OUT"/serve.json \
                 "$OUT"/threads.json "$OUT"/sched.json; do
            [ -s "$f" ] && python3 bench/figures.py "$f"
        done
    } >"$OUT/summary.txt" 2>&1
    cat "$OUT/summary.txt"
}

export GPU_DIR SITE LLAMA_DIR LLAMA_BENCH LLAMA_BENCH_ARCHIVE OUT
export -f install_polydev build_llama_bench

case "${1:-check}" in
    prepare) prepare ;;
    check) check ;;
    tests) tests ;;
    models) models ;;
    llama) llama ;;
    threads) threads ;;
    decode) decode ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" ;;
    *) say "unknown part '$1': prepare, check (the default), tests, models, llama, decode or" \
           "threads"
       exit 2 ;;
esac

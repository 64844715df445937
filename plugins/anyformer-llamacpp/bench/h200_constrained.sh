#!/usr/bin/env bash
# Issue 30's cost of structured output on the H200: bench_constrained.py on a CUDA build of llama.cpp, the
# next mask computed while llama_decode runs (the default with layers on the GPU) and in line (--in-line).
# Run THERE in the repository root with .h200/ from h200_prepare.sh carried (no network), llguidance's wheel
# added to it here first (the llama.cpp backend depends on it; h200_prepare.sh resolves the core only):
#
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --abi abi3 --platform manylinux_2_28_x86_64 --dest .h200/wheelhouse "llguidance>=1.0"
#
# results into $OUT/h200-constrained.txt:
#
#   bash plugins/anyformer-llamacpp/bench/h200_constrained.sh
#
# The model is SmolLM2-135M-Instruct's stand-in (random weights in its shapes, its real tokenizer: the
# 98 MB file cannot travel): decode speed and the constraint's mask work do not depend on the weights.
set -euo pipefail
cd "$(dirname "$0")/../../.."
carry=.h200
work="${H200_WORK:-/tmp/h200-constrained}"
out="${OUT:-plugins/anyformer-llamacpp/bench/results}"
results="$out/h200-constrained.txt"
mkdir -p "$work" "$out"
: >"$results"
say() { echo "$*" | tee -a "$results"; }
say "issue 30, constrained decoding on the H200 ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
say "command: bash plugins/anyformer-llamacpp/bench/h200_constrained.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/GPU: /' | tee -a "$results"
say "cores: $(nproc), python3: $(python3 --version 2>&1)"
eval "$(python3 scripts/llama_build.py env)"
say "llama.cpp build: $backend; CMAKE_ARGS=$cmake_args"
python3 -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip install --quiet --no-index --find-links "$carry/wheelhouse")
start=$SECONDS
"${pip[@]}" --upgrade pip >/dev/null
CMAKE_ARGS="$cmake_args" "${pip[@]}" ./anyformer-core ./plugins/anyformer-llamacpp gguf >"$work/install.log" 2>&1 \
  || { tail -n 30 "$work/install.log" | tee -a "$results"; exit 1; }
say "installed (llama-cpp-python built) in $((SECONDS - start)) s"
"$work/venv/bin/python" plugins/anyformer-llamacpp/bench/random_gguf.py write "$carry/smollm2-tokenizer.json" \
  "$work/stand-in.gguf" >>"$work/install.log" 2>&1
for mode in "" "--in-line"; do
  say ""
  say "\$ python plugins/anyformer-llamacpp/bench/bench_constrained.py --rounds 7 --tokens 128 --model stand-in.gguf $mode"
  PYTHONUNBUFFERED=1 "$work/venv/bin/python" plugins/anyformer-llamacpp/bench/bench_constrained.py --rounds 7 \
    --tokens 128 --model "$work/stand-in.gguf" $mode 2>&1 | tee -a "$results"
done

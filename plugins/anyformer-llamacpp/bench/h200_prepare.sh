#!/usr/bin/env bash
# Run HERE (a machine with PyPI), in the repository root, before h200_install_check.sh runs on the GPU
# machine (no network there): fills .h200/ (git ignores it, .h200/.gitignore) with what an offline
# `bash scripts/install` needs there:
#   .h200/wheelhouse/   every wheel the core (serve, gpu-probe extras) and the llama.cpp backend pull in,
#                       for CPython $H200_PYTHON (3.12) on manylinux x86-64, pip, hatchling and
#                       scikit-build-core (the build backends of anyformer's packages and of
#                       llama-cpp-python), gguf (to write the stand-in model), and the
#                       llama-cpp-python sdist trimmed of its .git, docs and vocabulary test models
#                       (76 MB -> about 13 MB), named as pip expects: llama_cpp_python-VERSION.tar.gz
#   .h200/smollm2-tokenizer.json   SmolLM2-135M-Instruct's tokenizer (the 98 MB model cannot travel:
#                       the GPU machine takes 64 MiB; a random-weight file in its shapes is written there)
# About 45 MB. Then carry `.h200` to the GPU machine and run h200_install_check.sh there.
#
#   bash plugins/anyformer-llamacpp/bench/h200_prepare.sh [--sdist llama_cpp_python-0.3.36.tar.gz] [--with-cmake]
#
# --sdist: a llama-cpp-python sdist already here (else pip downloads it); --with-cmake: also carry the
# cmake and ninja wheels (about 30 MB more) for a GPU machine without CMake; --carry: another folder
# than .h200. H200_PYTHON=3.11 (say) fetches the wheels for another Python on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../../.."
python="${PYTHON:-python3}"
target_python="${H200_PYTHON:-3.12}"
carry=.h200
sdist=""
with_cmake=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sdist) sdist="$2"; shift 2 ;;
    --with-cmake) with_cmake=1; shift ;;
    --carry) carry="$2"; shift 2 ;;
    *) echo "usage: $0 [--sdist FILE] [--with-cmake] [--carry DIR]" >&2; exit 2 ;;
  esac
done
version="$("$python" scripts/llama_build.py version)"
mkdir -p "$carry/wheelhouse"
printf '*\n' >"$carry/.gitignore"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The closure of what the install pulls in, resolved here; then each pin fetched as a wheel for the
# GPU machine's Python (a resolution for another interpreter cannot build llama-cpp-python's metadata).
# pip for the venv, hatchling (anyformer's build backend) and scikit-build-core (llama-cpp-python's) for
# the isolated builds, gguf and numpy for the stand-in model, numpy and diskcache for llama-cpp-python.
extras=(pip hatchling scikit-build-core gguf numpy diskcache)
[ "$with_cmake" = 1 ] && extras+=(cmake ninja)
"$python" -m pip install --quiet --dry-run --ignore-installed --report "$work/report.json" \
  "./anyformer-core[serve,gpu-probe]" "${extras[@]}"
"$python" plugins/anyformer-llamacpp/bench/h200_install_check.py pins "$work/report.json" >"$work/pins.txt"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$target_python" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --dest "$carry/wheelhouse" -r "$work/pins.txt"
if [ -z "$sdist" ]; then
  "$python" -m pip download --quiet --no-deps --no-binary=:all: --dest "$work" "llama-cpp-python==$version"
  sdist="$work/llama_cpp_python-$version.tar.gz"
fi
tar -xzf "$sdist" -C "$work"
tree="$work/llama_cpp_python-$version"
rm -rf "$tree/.git" "$tree/vendor/llama.cpp/.git" "$tree/vendor/llama.cpp/docs" "$tree"/vendor/llama.cpp/models/*.gguf
tar -czf "$carry/wheelhouse/llama_cpp_python-$version.tar.gz" -C "$work" "llama_cpp_python-$version"
PYTHONPATH="anyformer-core/src${PYTHONPATH:+:$PYTHONPATH}" "$python" plugins/anyformer-llamacpp/bench/random_gguf.py \
  export-tokenizer "$("$python" -c 'import anyformer; print(anyformer.default_model_path())')" \
  "$carry/smollm2-tokenizer.json"
du -sh "$carry"

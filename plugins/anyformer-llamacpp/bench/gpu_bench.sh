#!/usr/bin/env bash
# The decode benchmark on the lent GPU machine (no registry there): builds llama-cpp-python with CUDA
# from a carried source tree, writes a random-weight GGUF in SmolLM2-135M's shapes with its real
# tokenizer, and runs bench_decode.py fully offloaded and on the CPU. Carried in .devcarry/:
# wheels/ (gguf, pluggy, rich, scikit-build-core, diskcache…), llama-cpp-python-0.3.36-src.tar.gz
# (the sdist without .git, docs and vocab test models), smollm2-tokenizer.json (random_gguf.py
# export-tokenizer). Results go to $OUT.
set -euo pipefail
carry=.devcarry
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$carry"/wheels/*.whl
meta=/tmp/site/anyformer_llamacpp-0.1.0.dist-info
mkdir -p "$meta"
printf 'Metadata-Version: 2.1\nName: anyformer-llamacpp\nVersion: 0.1.0\n' >"$meta/METADATA"
printf '[anyformer]\nllamacpp = anyformer_llamacpp.plugin\n' >"$meta/entry_points.txt"
export PYTHONPATH=/tmp/site:$PWD/anyformer-core/src:$PWD/plugins/anyformer-llamacpp/src
if [ ! -d /tmp/llama/llama_cpp ]; then
  tar xzf "$carry/llama-cpp-python-0.3.36-src.tar.gz" -C /tmp
  (cd /tmp/llama_cpp_python-0.3.36 && CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90" \
    CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation --no-deps --no-index \
    --target /tmp/llama --config-settings=build-dir=/tmp/llbuild .) >"$OUT/build.log" 2>&1
fi
export PYTHONPATH=/tmp/llama:$PYTHONPATH
python3 plugins/anyformer-llamacpp/bench/random_gguf.py write "$carry/smollm2-tokenizer.json" /tmp/smol-rand-Q4_1.gguf
nvidia-smi --query-gpu=name,memory.free --format=csv | tee "$OUT/gpu.txt"
python3 -m anyformer check /tmp/smol-rand-Q4_1.gguf --json >"$OUT/check.json"
python3 -m anyformer check /tmp/smol-rand-Q4_1.gguf --budget "${PARTIAL_BUDGET:-150MB}" --json >"$OUT/check-partial.json"
# The probe's budget (every layer on the GPU), 0 (the CPU), and a budget that holds part of the layers.
for budget in "" 0 ${PARTIAL_BUDGET:-150MB}; do
  label=${budget:-gpu}
  PYTHONUNBUFFERED=1 python3 plugins/anyformer-llamacpp/bench/bench_decode.py --model /tmp/smol-rand-Q4_1.gguf \
    --rounds 5 --tokens 256 --no-cli ${budget:+--budget $budget} 2>&1 | grep -v '^llama_\|^load' | tee "$OUT/decode-$label.txt"
done

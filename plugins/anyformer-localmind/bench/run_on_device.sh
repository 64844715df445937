#!/bin/sh
# Run on a bare NVIDIA machine (the H200) in the repository root, with .gl/ from prepare_device.sh:
# installs the Vulkan loader and the wheels, builds llama-cpp-python with CUDA (about 4 minutes on 16
# cores; kept in /tmp for later runs on the same machine), then benches LocalMind against it on random
# weights in SmolLM2-135M's shapes (the real file is too large to carry). Extra arguments go to the
# bench, e.g. `--reference none` to skip llama.cpp.
set -eu
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/anyformer-bench-py .gl/wheels/*.whl
if [ -f .gl/llama-cpp-python.tar.gz ] && [ ! -d /tmp/anyformer-bench-llama/llama_cpp ]; then
    mkdir -p /tmp/anyformer-llama-src
    tar xzf .gl/llama-cpp-python.tar.gz -C /tmp/anyformer-llama-src
    (cd /tmp/anyformer-llama-src/llama_cpp_python-* &&
        CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        python3 -m pip install -q --no-build-isolation --no-deps --no-index --target /tmp/anyformer-bench-llama \
        --config-settings=build-dir=/tmp/anyformer-llama-build .)
fi
export PYTHONPATH=/tmp/anyformer-bench-llama:/tmp/anyformer-bench-py:anyformer-core/src:plugins/anyformer-gguf-gpu/src
export PYTHONUNBUFFERED=1
python3 plugins/anyformer-localmind/bench/bench_decode.py --random-smollm2 --tokens 256 --prompt 512 \
    --reference gpu --peak-gbps 4800 "$@"

#!/bin/sh
# Run on a bare NVIDIA machine (the H200) in the repository root, with .gl/ from prepare_device.sh:
# installs the Vulkan loader and the wheels, then benches LocalMind on random weights in
# SmolLM2-135M's shapes (the real file is too large to carry). Extra arguments go to the bench,
# e.g. `--reference gpu` when a CUDA build of llama-cpp-python is installed there.
set -eu
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
pip install -q --no-deps --no-index --target /tmp/anyformer-bench-py .gl/wheels/*.whl
export PYTHONPATH=/tmp/anyformer-bench-py:anyformer-core/src:plugins/anyformer-gguf-gpu/src
python3 plugins/anyformer-localmind/bench/bench_decode.py --random-smollm2 --tokens 256 --prompt 512 \
    --reference none --peak-gbps 4800 "$@"

#!/bin/sh
# Run on a bare NVIDIA machine (the H200) in the repository root, with `.h200` (scripts' wheelhouse: wgpu, gguf,
# the core's dependencies) and `.vk` (Debian's libvulkan1, libegl1, libglvnd0, libopengl0, libgl1, libglx0,
# libgles2, fetched with `apt-get download`) carried: installs them, then checks the modelled decode speed
# against the measured one on random weights in SmolLM2-135M's shapes. Extra arguments go to the bench.
set -eu
for f in .vk/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
python3 -m pip install -q --no-deps --no-index --no-compile --target /tmp/anyformer-speed-py .h200/wheelhouse/*.whl
export PYTHONPATH=/tmp/anyformer-speed-py:anyformer-core/src:plugins/anyformer-gguf-gpu/src:plugins/anyformer-localmind/src
export PYTHONUNBUFFERED=1
python3 plugins/anyformer-localmind/bench/bench_speed_model.py --random-smollm2 "$@"

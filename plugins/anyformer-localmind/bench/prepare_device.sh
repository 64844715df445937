#!/bin/sh
# Run here (in the repository root) before sending the tree to a bare GPU machine: puts the wheels the
# bench needs (Python 3.12, manylinux x86-64) and the Vulkan/GL loader packages in .gl/, which git
# ignores (.gl/.gitignore). Then run bench/run_on_device.sh there with `.gl` carried.
set -eu
mkdir -p .gl/wheels /tmp/amd64/partial
printf '*\n' > .gl/.gitignore
python -m pip download -q --only-binary=:all: --python-version 3.12 --no-deps -d .gl/wheels \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    wgpu cffi pycparser gguf pluggy pyyaml tqdm requests huggingface_hub jinja2 markupsafe rich \
    filelock fsspec packaging typing_extensions pygments markdown-it-py mdurl
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
apt-get $o update >/dev/null
(cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
du -sh .gl

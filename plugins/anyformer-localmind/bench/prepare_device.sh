#!/bin/sh
# Run here (in the repository root) before sending the tree to a bare GPU machine: puts the wheels the
# bench needs (Python 3.12, manylinux x86-64), the Vulkan/GL loader packages and a trimmed
# llama-cpp-python source (for a CUDA build there, the reference) in .gl/, which git ignores
# (.gl/.gitignore). About 22 MB. Then run bench/run_on_device.sh there with `.gl` carried.
set -eu
LLAMA_CPP_VERSION=0.3.36
mkdir -p .gl/wheels /tmp/amd64/partial
printf '*\n' > .gl/.gitignore
python -m pip download -q --only-binary=:all: --python-version 3.12 --no-deps -d .gl/wheels \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    wgpu cffi pycparser gguf pluggy pyyaml tqdm requests huggingface_hub jinja2 markupsafe rich \
    filelock fsspec packaging typing_extensions pygments markdown-it-py mdurl diskcache tokenizers pytest iniconfig pluggy
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
apt-get $o update >/dev/null
(cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
# The sdist is 76 MB; without git data, llama.cpp's docs and its vocabulary test files it packs to 13 MB.
src=$(mktemp -d)
python -m pip download -q --no-binary=:all: --no-deps -d "$src" "llama-cpp-python==$LLAMA_CPP_VERSION"
tar xzf "$src"/llama_cpp_python-*.tar.gz -C "$src"
tree="$src/llama_cpp_python-$LLAMA_CPP_VERSION"
rm -rf "$tree/.git" "$tree/vendor/llama.cpp/.git" "$tree/vendor/llama.cpp/docs" "$tree"/vendor/llama.cpp/models/*.gguf
tar czf .gl/llama-cpp-python.tar.gz -C "$src" "llama_cpp_python-$LLAMA_CPP_VERSION"
rm -rf "$src"
du -sh .gl

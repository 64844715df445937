"""The tests run on whatever adapter wgpu finds; lavapipe (a CPU Vulkan driver) counts as a GPU here."""

from __future__ import annotations

import os

# Before anything probes the machine: the core's probe counts a software adapter only with this set.
os.environ.setdefault("ANYFORMER_SOFTWARE_GPU", "1")

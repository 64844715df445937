"""anyformer's LocalMind backend: WGSL engines on wgpu, the whole GGUF model on the GPU."""

#: This backend's id: the name of its entry point.
BACKEND_ID = "localmind"

"""anyformer-llamacpp: GGUF models through llama-cpp-python. The hooks live in ``plugin``."""

#: The backend id, and the name of this distribution's entry point.
BACKEND_ID = "llamacpp"

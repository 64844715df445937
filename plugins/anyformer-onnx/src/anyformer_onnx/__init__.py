"""anyformer's ONNX backend: ONNX exports on onnxruntime (chat with a KV cache, embeddings)."""

#: The entry point's name: the id ``--backend`` and every verdict of this backend carry.
BACKEND_ID = "onnx"

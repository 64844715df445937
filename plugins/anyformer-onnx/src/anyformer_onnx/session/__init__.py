"""onnxruntime: which execution provider runs, and opening a validated graph as a session."""

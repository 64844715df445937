"""anyformer-diskformer: mixture-of-experts GGUFs larger than memory, experts streamed from disk."""

#: The backend id (the entry point's name).
BACKEND_ID = "diskformer"

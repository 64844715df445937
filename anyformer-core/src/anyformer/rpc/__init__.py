"""llama.cpp's RPC servers: the endpoints a load spans, the wire protocol's probe, and the lender."""

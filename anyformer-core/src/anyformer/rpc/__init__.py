"""llama.cpp's RPC servers: the wire protocol's probe, the server binary and the lender (the endpoints a
request names are parsed in the contract, ``contract/_endpoints.py``)."""

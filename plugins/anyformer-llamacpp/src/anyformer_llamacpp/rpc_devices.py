"""llama.cpp's RPC servers from this backend's side: asking them first, then adding them as devices.

Every server is asked (``anyformer.plugin.probe_rpc_server``: a connection with a timeout, the
protocol version, each device's memory) before llama.cpp connects to it, because llama.cpp ends
the whole process when a server is unreachable or speaks another version. The engine then adds
them through ggml's device registry (the ``RPC`` backend's ``ggml_backend_rpc_add_server``, then
``ggml_backend_register``), as llama.cpp's own ``--rpc`` does; llama.cpp puts registered RPC
devices first in a model's device list. The registry is the process's: such a load runs in an
isolated worker (the core sees to it), so the next load starts without them.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
from collections.abc import Sequence
from pathlib import Path

from anyformer.plugin import RpcServerError, RpcServerInfo, probe_rpc_server
from anyformer_llamacpp.runtime import llama_cpp_folder

REBUILD_HINT = (
    'rebuild it with RPC: CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_RPC=ON" pip install --force-reinstall --no-binary '
    "llama-cpp-python llama-cpp-python (scripts/install does this)"
)


def rpc_library() -> Path | None:
    """The ggml RPC library of the installed llama-cpp-python, or None when it was built without GGML_RPC."""
    folder = llama_cpp_folder()
    if folder is None:
        return None
    found = sorted((folder / "lib").glob("libggml-rpc*")) + sorted(folder.glob("libggml-rpc*"))
    return found[0] if found else None


def probe_servers(endpoints: Sequence[str]) -> list[RpcServerInfo]:
    """Ask every server at once (each within the probe's timeout).

    :class:`RpcServerError` names the first that fails.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(endpoints))) as pool:
        futures = [pool.submit(probe_rpc_server, endpoint) for endpoint in endpoints]
        return [future.result() for future in futures]


def register_servers(servers: Sequence[RpcServerInfo]) -> None:
    """Add each server's devices to llama.cpp's registry, in order (call only after :func:`probe_servers`)."""
    import llama_cpp

    # Symbols looked up through libllama's own handle resolve in the libggml it loaded: a wheel holds
    # each library as several files (libggml.so, .so.0, ...), and opening another would be a second
    # copy with a registry of its own that llama.cpp never sees.
    lib = llama_cpp.llama_cpp._lib
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_register.restype = None
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    registry = lib.ggml_backend_reg_by_name(b"RPC")
    if not registry:
        raise RpcServerError(
            servers[0].endpoint if servers else "-", f"cannot be used: llama.cpp has no RPC backend; {REBUILD_HINT}"
        )
    address = lib.ggml_backend_reg_get_proc_address(registry, b"ggml_backend_rpc_add_server")
    if not address:
        raise RpcServerError(servers[0].endpoint, "cannot be used: llama.cpp's RPC backend has no add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    for server in servers:
        added = add_server(server.endpoint.encode())
        if not added:
            raise RpcServerError(server.endpoint, "reported no devices to llama.cpp")
        lib.ggml_backend_register(added)

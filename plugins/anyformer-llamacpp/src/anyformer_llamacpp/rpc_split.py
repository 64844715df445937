"""Where a model's layers go when llama.cpp RPC servers lend their memory: a plan from what each offers.

llama.cpp puts the token embeddings, and here the output layer, on the host, and spreads the
repeating layers it is told to offload (``n_gpu_layers``) over its devices in the proportions of
``tensor_split``; RPC devices come first in its list, then local GPUs. The plan gives each device
as many whole layers as its memory holds after a reserve for its compute buffers, in proportion to
what each offers, and leaves the rest of the layers on the host's CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from anyformer.plugin import RpcServerInfo
from anyformer_llamacpp.estimate import kv_cache_bytes

#: Memory each device keeps for llama.cpp's compute buffers (activations of a 512-token batch and
#: the attention scores), besides the layers' weights and KV cache. Measured through the relay of
#: ``anyformer rpc-server --mem``: SmolLM2-135M at 512 tokens of context took 12 MB more than its
#: layers on each server; the reserve leaves room for larger models' activations.
DEVICE_RESERVE = 24 * 10**6
#: Bytes per weight of Q8_0, the least a quantized file keeps its token embeddings at.
_EMBEDDING_BYTES_PER_WEIGHT = 34 / 32
#: The host keeps the embeddings, the output layer and llama.cpp's own buffers (estimate.py's overhead).
HOST_OVERHEAD = 96 * 10**6


@dataclasses.dataclass(frozen=True)
class Device:
    """One device that takes layers: an RPC server's (by endpoint) or a local GPU."""

    name: str
    free: int


@dataclasses.dataclass(frozen=True)
class RpcPlan:
    """Layers per device, what the host keeps, and the arguments llama.cpp takes for it."""

    layers: int
    per_layer: int
    output_bytes: int
    devices: tuple[Device, ...]
    device_layers: tuple[int, ...]
    host_bytes: int

    @property
    def offloaded(self) -> int:
        """Repeating layers on the devices."""
        return sum(self.device_layers)

    @property
    def n_gpu_layers(self) -> int:
        """llama.cpp's ``n_gpu_layers``: it offloads the output layer first, then the last repeating layers."""
        return self.offloaded + 1 if self.offloaded else 0

    @property
    def tensor_split(self) -> list[float]:
        """llama.cpp's ``tensor_split`` over its ``n_gpu_layers`` slots, in device order: the last device's
        share holds the output layer's slot, which llama.cpp places last."""
        split = [float(n) for n in self.device_layers]
        if self.offloaded:
            split[-1] += 1.0
        return split

    def details(self) -> dict[str, Any]:
        """The split as ``Estimate.details["rpc"]`` shows it."""
        return {
            "devices": [
                {"device": d.name, "free": d.free, "layers": n}
                for d, n in zip(self.devices, self.device_layers, strict=True)
            ],
            "host_layers": self.layers - self.offloaded,
            "layers": self.layers,
            "output_on": self.devices[-1].name if self.offloaded else "host",
        }


def devices_of(servers: Sequence[RpcServerInfo], local_gpu_bytes: int = 0) -> list[Device]:
    """The devices in llama.cpp's order: every RPC server's devices, then the local GPU's budget (if any)."""
    devices = [
        Device(server.endpoint if len(server.devices) == 1 else f"{server.endpoint}#{i}", memory.free)
        for server in servers
        for i, memory in enumerate(server.devices)
    ]
    if local_gpu_bytes > 0:
        devices.append(Device("local GPU", local_gpu_bytes))
    return devices


def order_for_output(servers: Sequence[RpcServerInfo]) -> list[RpcServerInfo]:
    """The servers in the order to register them: the one with the most free memory last, where the
    output layer and its logits go (when there is no local GPU after them)."""
    return sorted(servers, key=lambda server: server.free_bytes)


def plan_split(
    facts: Mapping[str, Any], weights_bytes: int, context: int, batch: int, devices: Sequence[Device]
) -> RpcPlan:
    """Give each device whole layers in proportion to its memory (after :data:`DEVICE_RESERVE`); the host
    keeps the rest.

    The last device also takes the output layer and its logits (``batch`` x vocabulary floats), which
    llama.cpp offloads before any repeating layer. A repeating layer is taken to weigh the same as
    every other (weights and KV cache shared out evenly).
    """
    layers = facts.get("block_count")
    layers = layers if isinstance(layers, int) and layers > 0 else 1
    vocab, width, params = facts.get("vocab_size"), facts.get("embedding_length"), facts.get("parameter_count")
    embedding = 0
    if isinstance(vocab, int) and isinstance(width, int) and isinstance(params, int) and params > 0:
        # Quantizers keep the embeddings at 8 bits or more (Q8_0 in a Q4 file): never less than the average.
        per_weight = max(weights_bytes / params, _EMBEDDING_BYTES_PER_WEIGHT)
        embedding = min(weights_bytes // 2, int(vocab * width * per_weight))
    output = embedding + batch * (vocab if isinstance(vocab, int) else 0) * 4
    kv = kv_cache_bytes(facts, context, weights_bytes)
    # The file holds the embeddings once; a separate output matrix (untied) is left in the layers' share,
    # which then weigh a little more than they do.
    per_layer = max(1, -(-(weights_bytes - embedding + kv) // layers))
    usable = [max(0, d.free - DEVICE_RESERVE) for d in devices]
    if usable and usable[-1] >= output:
        usable[-1] -= output
        capacity = [u // per_layer for u in usable]
        shares = _proportional(min(layers, sum(capacity)), usable, capacity)
    else:
        shares = [0] * len(devices)  # the last device cannot take the output layer, which llama.cpp offloads first
    host_layers = layers - sum(shares)
    host = embedding + host_layers * per_layer + (0 if sum(shares) else output) + HOST_OVERHEAD
    return RpcPlan(layers, per_layer, output, tuple(devices), tuple(shares), host)


def _proportional(count: int, weights: Sequence[int], capacity: Sequence[int]) -> list[int]:
    """``count`` whole items shared in proportion to ``weights``, none over its ``capacity`` (largest remainders)."""
    total = sum(weights)
    if count <= 0 or total <= 0:
        return [0] * len(weights)
    exact = [count * w / total for w in weights]
    shares = [min(int(x), c) for x, c in zip(exact, capacity, strict=True)]
    by_remainder = sorted(range(len(weights)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    while sum(shares) < count:
        spare = [i for i in by_remainder if shares[i] < capacity[i]]
        if not spare:
            break
        shares[spare[0]] += 1
        by_remainder.remove(spare[0])
        by_remainder.append(spare[0])
    return shares

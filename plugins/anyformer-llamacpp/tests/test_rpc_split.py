"""The plan that spreads a GGUF's layers over RPC servers' memory (no server or llama.cpp needed)."""

from __future__ import annotations

from anyformer.plugin import RpcDeviceMemory, RpcServerInfo
from anyformer_llamacpp.rpc_split import DEVICE_RESERVE, Device, devices_of, order_for_output, plan_split

MB = 10**6
# SmolLM2-135M's header facts, as the core's description gives them.
FACTS = {
    "block_count": 30,
    "embedding_length": 576,
    "head_count": 9,
    "head_count_kv": 3,
    "vocab_size": 49152,
    "parameter_count": 134_515_008,
}
WEIGHTS = 98_362_432


def server(endpoint: str, *free: int) -> RpcServerInfo:
    return RpcServerInfo(endpoint, (7, 0, 0), tuple(RpcDeviceMemory(f, 2 * f) for f in free))


def test_layers_follow_each_devices_memory_and_the_last_takes_the_output() -> None:
    plan = plan_split(FACTS, WEIGHTS, 96, 96, [Device("a", 200 * MB), Device("b", 200 * MB)])
    assert plan.offloaded == 30 and plan.n_gpu_layers == 31
    # The last device pays for the output layer and its logits: it gets fewer layers.
    assert plan.device_layers[0] > plan.device_layers[1] > 0
    assert plan.tensor_split == [float(plan.device_layers[0]), float(plan.device_layers[1] + 1)]
    assert plan.details()["host_layers"] == 0 and plan.details()["output_on"] == "b"


def test_no_device_is_given_more_than_it_holds() -> None:
    devices = [Device("a", 60 * MB), Device("b", 300 * MB), Device("c", 90 * MB)]
    plan = plan_split(FACTS, WEIGHTS, 96, 96, devices)
    usable = [d.free - DEVICE_RESERVE for d in devices]
    usable[-1] -= plan.output_bytes
    for layers, room in zip(plan.device_layers, usable, strict=True):
        assert layers * plan.per_layer <= room


def test_what_the_devices_cannot_hold_stays_on_the_host() -> None:
    plan = plan_split(FACTS, WEIGHTS, 96, 96, [Device("a", 40 * MB), Device("b", 80 * MB)])
    assert 0 < plan.offloaded < 30
    small = plan_split(FACTS, WEIGHTS, 96, 96, [Device("a", 10 * MB)])
    assert small.offloaded == 0 and small.n_gpu_layers == 0 and small.tensor_split == [0.0]
    assert plan.host_bytes < small.host_bytes


def test_the_server_with_the_most_memory_goes_last_and_a_local_gpu_after_every_server() -> None:
    servers = order_for_output([server("big:1", 900 * MB), server("small:2", 100 * MB), server("two:3", 50, 70)])
    assert [s.endpoint for s in servers] == ["two:3", "small:2", "big:1"]
    names = [d.name for d in devices_of(servers, local_gpu_bytes=4000 * MB)]
    assert names == ["two:3#0", "two:3#1", "small:2", "big:1", "local GPU"]
    assert [d.name for d in devices_of(servers)] == names[:-1]

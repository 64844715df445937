"""A model's text side from its repo files: ``tokenizer.json``, the chat template, generation defaults.

Used by every text task of this backend (and meant to be shared with other ONNX-based backends):
the tokenizer through ``tokenizers`` (Rust, no Python code from the repo), the chat template from
``chat_template.jinja`` or ``tokenizer_config.json`` rendered by the core's sandbox, and
``generation_config.json``'s end-of-sequence ids and repetition penalty.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, Message, Model, read_config_json, render_chat

#: Repo files the text side reads, each when present.
TEXT_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "config.json",
)
#: The largest tokenizer.json read (real ones reach ~35 MB for 256k vocabularies).
MAX_TOKENIZER_BYTES = 64 * 2**20
#: The largest chat_template.jinja read; the core refuses to render longer templates anyway.
MAX_TEMPLATE_BYTES = 256 * 1024


def present_text_files(model: Model) -> list[str]:
    """The text-side files this model has, by repo name."""
    return [name for name in TEXT_FILES if model.file(name) is not None]


def _token_text(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string, or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return ""


def _ids(value: Any) -> set[int]:
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int) and not isinstance(v, bool)}
    return set()


def _template_of(config: Mapping[str, Any]) -> str | None:
    """tokenizer_config.json's ``chat_template``: a string, or a list of named ones (``default`` wins)."""
    value = config.get("chat_template")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        chosen = named.get("default") or next(iter(named.values()), None)
        return chosen if isinstance(chosen, str) else None
    return None


@dataclasses.dataclass
class TextSetup:
    """The tokenizer and the chat and generation settings of one model."""

    tokenizer: Any
    template: str | None
    bos_token: str
    eos_token: str
    eos_ids: frozenset[int]
    repetition_penalty: float
    top_k: int
    top_p: float
    config: Mapping[str, Any]

    def render(
        self,
        messages: list[Message],
        thinking: bool = False,
        *,
        blocks: bool = False,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The chat template rendered in the core's sandbox (ChatML when the model has none); with ``blocks``
        the template sees list content as its blocks (``render_chat(blocks=True)``), as a multimodal one expects;
        ``variables`` are extra template variables (the call's ``tools``)."""
        return render_chat(
            self.template,
            messages,
            add_generation_prompt=True,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            blocks=blocks,
            enable_thinking=thinking,
            **(variables or {}),
        )

    def prompt_ids(
        self, messages: list[Message], thinking: bool = False, variables: Mapping[str, Any] | None = None
    ) -> list[int]:
        """The rendered prompt's token ids; the template writes the special tokens, as transformers does."""
        text = self.render(messages, thinking, variables=variables)
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)


def load_tokenizer(path: Path, label: str) -> Any:
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json``; ``BAD_MODEL`` when it is too large or unreadable."""
    from tokenizers import Tokenizer

    try:
        size = path.stat().st_size
    except OSError as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: cannot read tokenizer.json: {exc}", cause=exc) from exc
    if size > MAX_TOKENIZER_BYTES:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: tokenizer.json is {size} bytes; refused")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for every parse error
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: tokenizer.json is not valid: {exc}", cause=exc) from exc


def load_text_setup(paths: Mapping[str, Path], label: str) -> TextSetup:
    """Read the text side from local ``paths`` (repo name → path); ``BAD_MODEL`` without a tokenizer.json."""
    if "tokenizer.json" not in paths:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label} has no tokenizer.json")
    tokenizer = load_tokenizer(paths["tokenizer.json"], label)

    def config(name: str) -> dict[str, Any]:
        return read_config_json(paths[name], f"{name} of {label}") if name in paths else {}

    tokenizer_config = config("tokenizer_config.json")
    special = config("special_tokens_map.json")
    generation = config("generation_config.json")
    model_config = config("config.json")
    template = _template_of(tokenizer_config)
    if "chat_template.jinja" in paths:
        template_path = paths["chat_template.jinja"]
        if template_path.stat().st_size > MAX_TEMPLATE_BYTES:
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{label}: chat_template.jinja is over {MAX_TEMPLATE_BYTES} bytes"
            )
        try:
            template = template_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: chat_template.jinja is unreadable", cause=exc) from exc
    bos = _token_text(tokenizer_config.get("bos_token")) or _token_text(special.get("bos_token"))
    eos = _token_text(tokenizer_config.get("eos_token")) or _token_text(special.get("eos_token"))
    eos_ids = _ids(generation.get("eos_token_id")) or _ids(model_config.get("eos_token_id"))
    if eos:
        token = tokenizer.token_to_id(eos)
        if token is not None:
            eos_ids.add(int(token))
    penalty = generation.get("repetition_penalty")
    top_k = generation.get("top_k")
    top_p = generation.get("top_p")
    return TextSetup(
        tokenizer=tokenizer,
        template=template,
        bos_token=bos,
        eos_token=eos,
        eos_ids=frozenset(eos_ids),
        repetition_penalty=float(penalty) if isinstance(penalty, (int, float)) and penalty > 0 else 1.0,
        # transformers' defaults where the model names none.
        top_k=int(top_k) if isinstance(top_k, int) and top_k >= 0 else 50,
        top_p=float(top_p) if isinstance(top_p, (int, float)) and 0 < top_p <= 1 else 1.0,
        config=model_config,
    )

"""The tokenizer side of a text-diffusion repo: ids <-> text, the mask token, stop tokens, the chat template.

Read from ``tokenizer.json`` (the ``tokenizers`` library), ``tokenizer_config.json``,
``chat_template.jinja`` and ``config.json``, each bounded in size. The mask token is what the
diffusion starts from: ``config.json``'s ``mask_token_id`` when given, else the tokenizer's
``mask_token``, else one of the names MDLM-family tokenizers use. A repo with none is ``BAD_MODEL``.
Apart from the mask token, nothing here is diffusion-specific: the tokenizer and template loading
is the part another ONNX backend would share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, read_config_json

#: The largest tokenizer.json read (real ones are a few MiB; the biggest around 30 MiB).
MAX_TOKENIZER_BYTES = 64 * 2**20
#: The largest chat_template.jinja read.
MAX_TEMPLATE_BYTES = 256 * 1024
#: Mask-token names tried when neither config.json nor tokenizer_config.json names one.
MASK_NAMES = ("[MASK]", "<|mask|>", "<mask>", "<|mdm_mask|>", "<|MASK|>")
#: Token names that end an answer besides the tokenizer's own end-of-sequence token.
END_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json")


def _token_text(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string, or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


@dataclasses.dataclass
class TextCodec:
    """A loaded tokenizer with the facts the sampler and the chat prompt need."""

    tokenizer: Any
    mask_id: int
    mask_text: str
    stop_ids: frozenset[int]
    chat_template: str | None
    bos_token: str
    eos_token: str

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as written (the chat template already placed any special tokens)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens left out."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def decode_with_masks(self, ids: Sequence[int], mask_text: str | None = None) -> str:
        """The text of ``ids`` with every still-masked position shown as ``mask_text`` (the mask token's text)."""
        shown = self.mask_text if mask_text is None else mask_text
        parts: list[str] = []
        run: list[int] = []
        for token in ids:
            if token == self.mask_id:
                if run:
                    parts.append(self.decode(run))
                    run = []
                parts.append(shown)
            else:
                run.append(int(token))
        if run:
            parts.append(self.decode(run))
        return "".join(parts)


def _read_template(files: Mapping[str, Path], tokenizer_config: Mapping[str, Any]) -> str | None:
    path = files.get("chat_template.jinja")
    if path is not None:
        if path.stat().st_size > MAX_TEMPLATE_BYTES:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"chat_template.jinja is over {MAX_TEMPLATE_BYTES} bytes")
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"chat_template.jinja is unreadable: {exc}", cause=exc) from exc
    template = tokenizer_config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):
        # The list form names several templates; "default" is the chat one.
        for entry in template:
            if isinstance(entry, Mapping) and entry.get("name") == "default" and isinstance(entry.get("template"), str):
                return str(entry["template"])
    return None


def _mask_id(tokenizer: Any, config: Mapping[str, Any], tokenizer_config: Mapping[str, Any], vocab: int) -> int:
    configured = config.get("mask_token_id")
    if isinstance(configured, int) and not isinstance(configured, bool):
        if not 0 <= configured < vocab:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"config.json mask_token_id {configured} is outside the vocab")
        return configured
    for name in (_token_text(tokenizer_config.get("mask_token")), *MASK_NAMES):
        if name:
            token = tokenizer.token_to_id(name)
            if token is not None:
                return int(token)
    raise AnyformerError(
        ErrorCode.BAD_MODEL,
        "the model has no mask token (config.json mask_token_id or a tokenizer mask_token): not a masked-diffusion LM",
    )


def load_codec(files: Mapping[str, Path]) -> TextCodec:
    """Load the tokenizer and its facts from the repo's local files (``tokenizer.json`` is required)."""
    from tokenizers import Tokenizer

    tokenizer_path = files.get("tokenizer.json")
    if tokenizer_path is None:
        raise AnyformerError(ErrorCode.BAD_MODEL, "the repo has no tokenizer.json")
    if tokenizer_path.stat().st_size > MAX_TOKENIZER_BYTES:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"tokenizer.json is over {MAX_TOKENIZER_BYTES // 2**20} MiB")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    except Exception as exc:  # tokenizers raises a bare Exception for malformed files
        raise AnyformerError(ErrorCode.BAD_MODEL, f"tokenizer.json does not load: {exc}", cause=exc) from exc
    config = read_config_json(files["config.json"], "config.json") if "config.json" in files else {}
    tok_config = (
        read_config_json(files["tokenizer_config.json"], "tokenizer_config.json")
        if "tokenizer_config.json" in files
        else {}
    )
    vocab = int(tokenizer.get_vocab_size(with_added_tokens=True))
    mask_id = _mask_id(tokenizer, config, tok_config, vocab)
    eos = _token_text(tok_config.get("eos_token")) or ""
    stops = {tokenizer.token_to_id(name) for name in (eos, *END_NAMES) if name}
    eos_id = config.get("eos_token_id")
    if isinstance(eos_id, int) and not isinstance(eos_id, bool):
        stops.add(eos_id)
    elif isinstance(eos_id, list):
        stops.update(i for i in eos_id if isinstance(i, int) and not isinstance(i, bool))
    stops.discard(None)
    stops.discard(mask_id)
    return TextCodec(
        tokenizer=tokenizer,
        mask_id=mask_id,
        mask_text=str(tokenizer.id_to_token(mask_id) or "[MASK]"),
        stop_ids=frozenset(int(s) for s in stops if s is not None),
        chat_template=_read_template(files, tok_config),
        bos_token=_token_text(tok_config.get("bos_token")) or "",
        eos_token=eos,
    )

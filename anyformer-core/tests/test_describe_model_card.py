"""A local folder's tags and task come from README.md's front matter, as the Hub reads them."""

from __future__ import annotations

import pathlib

import pytest

import anyformer
from anyformer.files._model_card import MAX_CARD_BYTES, read_card_facts


def _folder(tmp_path: pathlib.Path, card: str | bytes) -> pathlib.Path:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    data = card.encode("utf-8") if isinstance(card, str) else card
    (tmp_path / "README.md").write_bytes(data)
    return tmp_path


def test_a_block_list_of_tags_and_the_pipeline_tag_are_read(tmp_path: pathlib.Path) -> None:
    card = (
        "---\nlicense: mit\ntags:\n  - text-diffusion\n  - 'block-diffusion'  \n"
        "pipeline_tag: text-generation\n---\n# hi\n"
    )
    model = anyformer.describe(_folder(tmp_path, card))
    assert model.tags == ("text-diffusion", "block-diffusion")
    assert model.task == "text-generation"


def test_a_flow_list_of_tags_is_read(tmp_path: pathlib.Path) -> None:
    model = anyformer.describe(_folder(tmp_path, '---\ntags: [text-diffusion, "mdlm"]\n---\n'))
    assert model.tags == ("text-diffusion", "mdlm")


def test_config_pipeline_tag_wins_over_the_card(tmp_path: pathlib.Path) -> None:
    folder = _folder(tmp_path, "---\npipeline_tag: fill-mask\n---\n")
    (folder / "config.json").write_text('{"pipeline_tag": "text-generation"}', encoding="utf-8")
    assert anyformer.describe(folder).task == "text-generation"


@pytest.mark.parametrize(
    "card",
    [
        "no front matter\ntags:\n  - x\n",
        "---\ntags:\n  - never-closed\n",
        b"\xff\xfe---\x00garbage",
        "",
    ],
)
def test_a_card_without_valid_front_matter_gives_no_tags(tmp_path: pathlib.Path, card: str | bytes) -> None:
    model = anyformer.describe(_folder(tmp_path, card))
    assert model.tags == ()
    assert model.task is None


def test_only_the_first_bytes_of_a_huge_card_are_read(tmp_path: pathlib.Path) -> None:
    card = "---\n" + "# filler line\n" * (MAX_CARD_BYTES // 10) + "tags: [late]\n---\n"
    assert read_card_facts(_folder(tmp_path, card) / "README.md").tags == ()


def test_a_folder_without_a_card_has_no_tags(tmp_path: pathlib.Path) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    assert anyformer.describe(tmp_path).tags == ()

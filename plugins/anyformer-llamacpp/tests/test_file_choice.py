"""Which GGUF of a repo llama.cpp loads: projectors skipped, quant preference, split sets."""

from __future__ import annotations

from anyformer import Model, ModelFile
from anyformer_llamacpp.file_choice import choose_gguf, projector_for, quant_of


def _repo(*names: str) -> Model:
    return Model(repo="org/x", files=tuple(ModelFile(name=n, size=1000) for n in names), source="description")


def test_quant_preference_picks_q4_k_m_over_others() -> None:
    model = _repo("x-Q8_0.gguf", "x-Q4_K_M.gguf", "x-Q4_0.gguf", "x-F16.gguf")
    choice = choose_gguf(model)
    assert choice is not None and choice.first.name == "x-Q4_K_M.gguf" and choice.quant == "Q4_K_M"


def test_preference_order_follows_the_list() -> None:
    assert choose_gguf(_repo("x-Q6_K.gguf", "x-Q5_K_S.gguf")).first.name == "x-Q5_K_S.gguf"
    assert choose_gguf(_repo("x-Q8_0.gguf", "x-Q6_K.gguf")).first.name == "x-Q6_K.gguf"


def test_other_llamacpp_types_come_after_the_preferred_ones() -> None:
    assert choose_gguf(_repo("x-IQ4_XS.gguf", "x-Q8_0.gguf")).first.name == "x-Q8_0.gguf"
    assert choose_gguf(_repo("x-IQ4_XS.gguf")).first.name == "x-IQ4_XS.gguf"
    assert choose_gguf(_repo("SmolLM2-135M-Instruct.Q4_1.gguf")).quant == "Q4_1"


def test_projector_is_never_the_language_model() -> None:
    assert choose_gguf(_repo("mmproj-model-f16.gguf")) is None
    model = _repo("mmproj-x-f16.gguf", "x-Q4_0.gguf")
    assert choose_gguf(model).first.name == "x-Q4_0.gguf"
    assert projector_for(model).name == "mmproj-x-f16.gguf"


def test_a_type_llamacpp_does_not_read_is_skipped() -> None:
    assert quant_of("Ternary-Bonsai-PTQ1_0.gguf") == "PTQ1_0"
    assert choose_gguf(_repo("Ternary-Bonsai-PTQ1_0.gguf", "Ternary-Bonsai-PQ2_0.gguf")) is None


def test_a_name_without_a_quant_is_left_to_the_header() -> None:
    choice = choose_gguf(_repo("model.gguf"))
    assert choice is not None and choice.quant is None


def test_complete_split_set_is_one_model_in_order() -> None:
    model = _repo("q/x-Q4_K_M-00002-of-00003.gguf", "q/x-Q4_K_M-00001-of-00003.gguf", "q/x-Q4_K_M-00003-of-00003.gguf")
    choice = choose_gguf(model)
    assert choice is not None
    assert [f.name for f in choice.files] == [
        "q/x-Q4_K_M-00001-of-00003.gguf",
        "q/x-Q4_K_M-00002-of-00003.gguf",
        "q/x-Q4_K_M-00003-of-00003.gguf",
    ]
    assert choice.size == 3000


def test_incomplete_split_set_is_no_model() -> None:
    assert choose_gguf(_repo("x-Q4_K_M-00001-of-00003.gguf", "x-Q4_K_M-00003-of-00003.gguf")) is None
    model = _repo("x-Q4_K_M-00001-of-00002.gguf", "x-Q8_0.gguf")
    assert choose_gguf(model).first.name == "x-Q8_0.gguf"

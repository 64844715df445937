"""Vision and speech tasks through ``loaded.run`` against ``transformers.pipeline`` on the same weights and input.

The models are tiny random ones (tiny_media.py): ViT, YOLOS, SegFormer, DPT and a Whisper. Labels,
boxes and masks must be equal, scores and depths within 1e-5; a Pillow image or tensor in the
pipeline's answer is an array in the backend's (plain data, as the ONNX backend returns it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tiny_media import picture, tone

import anyformer
from anyformer import AnyformerError, ErrorCode

IMAGES = [picture(50, 40, seed=0), picture(29, 61, seed=1)]


def _pipeline(folder: Path, task: str) -> Any:
    import torch
    from transformers import pipeline

    build: Any = pipeline  # its overloads want a literal task name
    return build(task, model=str(folder), dtype=torch.float32, device="cpu")


def _plain(value: Any) -> Any:
    """A pipeline's answer as plain data: Pillow images and tensors as numpy arrays, numpy scalars as numbers."""
    from PIL import Image

    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Image.Image):
        return np.asarray(value)
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return value.item() if hasattr(value, "item") else value


def _pillow(pixels: Any) -> Any:
    from PIL import Image

    return Image.fromarray(pixels, mode="RGB")


def _same(got: Any, want: Any) -> None:
    """Equal structures, labels, boxes and masks exactly, scores and depths within 1e-5."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), (got, want)
        for key in want:
            _same(got[key], want[key])
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (got, want)
        for a, b in zip(got, want, strict=True):
            _same(a, b)
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.shape == want.shape, (getattr(got, "shape", got), want.shape)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
        else:
            assert got.dtype == want.dtype and (got == want).all()
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-5)
    else:
        assert got == want


@pytest.fixture(
    scope="module", params=["image-classification", "object-detection", "image-segmentation", "depth-estimation"]
)
def vision(
    request: pytest.FixtureRequest, tiny_media_dir: dict[str, Path]
) -> Iterator[tuple[str, anyformer.Loaded, Any]]:
    task = request.param
    folder = tiny_media_dir[task]
    with anyformer.load(folder, backend="transformers", isolate=False) as model:
        yield task, model, _pipeline(folder, task)


OPTIONS = {
    "image-classification": [{}, {"top_k": 2}, {"function_to_apply": "sigmoid"}],
    "object-detection": [{}, {"threshold": 0.0}],
    "image-segmentation": [{}],
    "depth-estimation": [{}],
}


def test_vision_task_answers_as_the_pipeline(vision: tuple[str, anyformer.Loaded, Any]) -> None:
    task, model, pipe = vision
    assert model.task == task
    for options in OPTIONS[task]:
        for image in IMAGES:
            _same(model.run(image, **options), _plain(pipe(_pillow(image), **options)))
        _same(model.run(list(IMAGES), **options), [_plain(pipe(_pillow(image), **options)) for image in IMAGES])


@pytest.mark.parametrize("subtask", [None, "panoptic", "instance", "semantic"])
def test_mask2former_segments_as_the_pipeline(subtask: str | None, tiny_media_dir: dict[str, Path]) -> None:
    """A universal head: each subtask through the processor's post-processing, as the pipeline runs it."""
    folder = tiny_media_dir["universal-segmentation"]
    pipe = _pipeline(folder, "image-segmentation")
    found = 0
    with anyformer.load(folder, backend="transformers", task="image-segmentation", isolate=False) as model:
        for threshold in (0.9, 0.3):
            for image in IMAGES:
                want = _plain(pipe(_pillow(image), subtask=subtask, threshold=threshold))
                _same(model.run(image, subtask=subtask, threshold=threshold), want)
                found += len(want)
    assert found > 0  # the comparison saw segments


def test_the_comparison_is_not_empty(tiny_media_dir: dict[str, Path]) -> None:
    """The answers compared above vary: boxes differ, several classes are found, the depth map is not flat."""
    with anyformer.load(tiny_media_dir["object-detection"], backend="transformers", isolate=False) as model:
        found = model.run(IMAGES[0], threshold=0.0)
        assert len(found) == 5 and len({str(f["box"]) for f in found}) > 1, found
    with anyformer.load(tiny_media_dir["image-segmentation"], backend="transformers", isolate=False) as model:
        assert len(model.run(IMAGES[0])) > 1
    with anyformer.load(tiny_media_dir["depth-estimation"], backend="transformers", isolate=False) as model:
        depth = model.run(IMAGES[0])
        assert depth["predicted_depth"].shape == (40, 50) and float(depth["predicted_depth"].std()) > 0
        assert len(set(depth["depth"].reshape(-1).tolist())) > 10


def test_vision_refuses_bad_options_and_input(vision: tuple[str, anyformer.Loaded, Any]) -> None:
    _, model, _ = vision
    with pytest.raises(AnyformerError) as caught:
        model.run(IMAGES[0], colour="red")
    assert caught.value.code is ErrorCode.BAD_REQUEST and "colour" in str(caught.value)
    with pytest.raises(AnyformerError) as caught:
        model.run(b"not an image")
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_vision_run_reports_each_image_and_stops_when_cancelled(tiny_media_dir: dict[str, Path]) -> None:
    import threading

    events: list[Any] = []
    cancel = threading.Event()

    def report(event: Any) -> None:
        events.append(event)
        cancel.set()

    with anyformer.load(tiny_media_dir["image-classification"], backend="transformers", isolate=False) as model:
        assert model.run_progress
        model.run(list(IMAGES), progress=events.append)
        assert [(e.stage, e.done, e.total) for e in events] == [("classify", 1, 2), ("classify", 2, 2)]
        events.clear()
        with pytest.raises(AnyformerError) as caught:
            model.run(list(IMAGES), progress=report, cancel=cancel)
        assert caught.value.code is ErrorCode.CANCELLED and len(events) == 1


@pytest.fixture(scope="module")
def whisper(tiny_media_dir: dict[str, Path]) -> Iterator[tuple[anyformer.Loaded, Any]]:
    folder = tiny_media_dir["automatic-speech-recognition"]
    with anyformer.load(folder, backend="transformers", isolate=False) as model:
        yield model, _pipeline(folder, "automatic-speech-recognition")


#: The pipeline's generation made greedy (transformers 5's ASR pipeline searches with 5 beams unless told).
GREEDY = {"num_beams": 1}
CLIPS = [tone(1.5, 220.0, seed=0), tone(3.0, 330.0, seed=1)]


def test_speech_transcribes_as_the_pipeline(whisper: tuple[anyformer.Loaded, Any]) -> None:
    model, pipe = whisper
    assert model.task == "automatic-speech-recognition"
    texts = []
    for clip in CLIPS:
        want = pipe({"raw": clip.copy(), "sampling_rate": 16000}, generate_kwargs=GREEDY)
        assert model.run(clip) == {"text": want["text"]}
        texts.append(want["text"])
        french = pipe({"raw": clip.copy(), "sampling_rate": 16000}, generate_kwargs={**GREEDY, "language": "fr"})
        assert model.run({"raw": clip, "sampling_rate": 16000}, language="fr") == {"text": french["text"]}
    assert model.run(list(CLIPS)) == [{"text": text} for text in texts]
    assert len(set(texts)) == 2 and all(texts), texts  # the clips give different, non-empty texts


def test_speech_refuses_what_it_does_not_honour(whisper: tuple[anyformer.Loaded, Any]) -> None:
    model, _ = whisper
    cases = [
        ({"return_timestamps": True}, "return_timestamps"),
        ({"language": "xx"}, "language"),
        ({"task": "summarise"}, "task"),
    ]
    for options, word in cases:
        with pytest.raises(AnyformerError) as caught:
            model.run(CLIPS[0], **options)
        assert caught.value.code is ErrorCode.BAD_REQUEST and word in str(caught.value), options
    for clip, word in (({"raw": CLIPS[0], "sampling_rate": 8000}, "8000 Hz"), (tone(31.0, 200.0), "30 s")):
        with pytest.raises(AnyformerError) as caught:
            model.run(clip)
        assert caught.value.code is ErrorCode.BAD_REQUEST and word in str(caught.value)


def _described(folder: Path) -> anyformer.Model:
    import json

    files = [{"name": p.name, "size": p.stat().st_size} for p in sorted(folder.iterdir()) if p.is_file()]
    model = anyformer.Model.from_dict({"repo": "org/" + folder.name, "source": "hub", "files": files})
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    import dataclasses

    return dataclasses.replace(model, config=config)


@pytest.mark.parametrize(
    "task",
    [
        "image-classification",
        "object-detection",
        "image-segmentation",
        "depth-estimation",
        "automatic-speech-recognition",
    ],
)
def test_can_run_reads_the_task_from_the_architecture_and_wants_the_preprocessor(
    task: str, tiny_media_dir: dict[str, Path]
) -> None:
    import dataclasses

    from anyformer_transformers.plugin import can_run

    caps = anyformer.Caps(ram_bytes=8 * 2**30, store=True, cpu_count=2)
    model = _described(tiny_media_dir[task])
    verdict = can_run(model, caps, anyformer.Request())
    assert verdict.ok, verdict.reason
    assert verdict.estimate is not None and "preprocessor_config.json" in verdict.estimate.files
    assert verdict.estimate.details["dtype"] == "float32"
    bare = dataclasses.replace(model, files=tuple(f for f in model.files if f.name != "preprocessor_config.json"))
    refused = can_run(bare, caps, anyformer.Request())
    assert refused.code is anyformer.Refusal.MODEL and "preprocessor_config.json" in refused.reason


def test_an_isolated_worker_returns_the_same_arrays(tiny_media_dir: dict[str, Path]) -> None:
    """Depth maps are numpy arrays: they cross the isolated worker's pipe unchanged."""
    folder = tiny_media_dir["depth-estimation"]
    with anyformer.load(folder, backend="transformers", isolate=False) as model:
        here = model.run(IMAGES[1])
    with anyformer.load(folder, backend="transformers", isolate=True) as model:
        there = model.run(IMAGES[1])
    _same(there, here)

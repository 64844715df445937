"""Speech recognition on a Whisper-style encoder-decoder in optimum's split layout (three graphs)."""

from __future__ import annotations

from anyformer.plugin import BackendModel, Model, ProgressCallback, Refusal, Request
from anyformer_onnx.graphs import SPEECH_STEMS, GraphSet, choose_graph_set
from anyformer_onnx.speech.speech_files import SPEECH_FILES
from anyformer_onnx.tasks.family import Graphs, Problem, TaskFamily, known_paths
from anyformer_onnx.tasks.names import SPEECH_RECOGNITION

#: Speech models (config.json ``model_type``) whose encoder-decoder export and log-mel front end are read.
WHISPER_STYLE = ("whisper",)


def _choose(model: Model, device: str, wanted: str | None) -> GraphSet | None:
    return choose_graph_set(model, SPEECH_STEMS, device, wanted)


def _problem(model: Model, _task: str, _graphs: Graphs | None) -> Problem:
    kind = model.config.get("model_type")
    if kind not in WHISPER_STYLE:
        return Refusal.MODEL, f"speech model {kind!r}: this backend reads Whisper-style encoder-decoders"
    missing = [name for name in SPEECH_FILES if model.file(name) is None]
    if missing:
        return Refusal.FORMAT, f"automatic-speech-recognition needs {missing[0]}, absent here"
    return None


def _guess(model: Model) -> str | None:
    # Before chat's guess: a Whisper repo holds a decoder_model_merged too.
    return SPEECH_RECOGNITION if model.config.get("model_type") in WHISPER_STYLE else None


def _open(
    model: Model, request: Request, progress: ProgressCallback, task: str, graphs: Graphs, provider: str
) -> BackendModel:
    from anyformer_onnx.speech.loading import open_speech_model  # numpy and the log-mel front end: at load only

    assert isinstance(graphs, GraphSet)  # this family chooses a set of graphs
    return open_speech_model(model, request, progress, graphs, provider, FAMILY.files)


FAMILY = TaskFamily(
    name="speech",
    tasks=(SPEECH_RECOGNITION,),
    choose=_choose,
    graph_paths=known_paths(SPEECH_STEMS, all_of=True),
    open=_open,
    files=(*SPEECH_FILES, "config.json"),
    problem=_problem,
    guess=_guess,
    architectures=(
        ("WhisperForConditionalGeneration", SPEECH_RECOGNITION),
        ("ForSpeechSeq2Seq", SPEECH_RECOGNITION),
        ("ForCTC", SPEECH_RECOGNITION),
    ),
)

"""Opening sessions: CUDA's libraries are preloaded from the nvidia wheels once, only when CUDA is chosen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime
import pytest

from anyformer_onnx.session import ort_session
from anyformer_onnx.session import providers as runtime


@pytest.fixture(autouse=True)
def _fresh_preload() -> Any:
    ort_session.preload_cuda_libraries.cache_clear()
    yield
    ort_session.preload_cuda_libraries.cache_clear()


def _identity_graph(path: Path) -> Path:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path.write_bytes(model.SerializeToString())
    return path


def test_cuda_preloads_the_wheels_libraries_once_and_falls_back_to_what_the_session_runs_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[int] = []

    def preload() -> None:
        calls.append(1)
        print("onnxruntime would print this on a miss")
        raise OSError("libcudnn.so.9: cannot open shared object file")

    monkeypatch.setattr(onnxruntime, "preload_dlls", preload, raising=False)
    monkeypatch.setattr(ort_session, "available_providers", lambda: [runtime.CUDA, runtime.CPU])
    opened: list[list[str]] = []
    real = onnxruntime.InferenceSession

    def session(path: str, sess_options: Any = None, providers: list[str] | None = None) -> Any:
        opened.append(list(providers or []))
        return real(path, sess_options=sess_options, providers=[runtime.CPU])

    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    graph = _identity_graph(tmp_path / "model.onnx")
    for _ in range(2):
        _, actual = ort_session.open_session(graph)
        assert actual == runtime.CPU  # what the session really runs on, not what was asked for
    assert calls == [1], "preloaded once, and a failure in it is not the caller's"
    assert opened == [[runtime.CUDA, runtime.CPU]] * 2


def test_the_cpu_never_preloads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[int] = []
    monkeypatch.setattr(onnxruntime, "preload_dlls", lambda: calls.append(1), raising=False)
    monkeypatch.setattr(ort_session, "available_providers", lambda: [runtime.CPU])
    _, actual = ort_session.open_session(_identity_graph(tmp_path / "model.onnx"))
    assert actual == runtime.CPU
    assert calls == []


def test_a_run_the_graph_refuses_is_bad_request_quoting_the_errors_first_line(tmp_path: Path) -> None:
    import numpy as np

    from anyformer.plugin import AnyformerError, ErrorCode

    session, _ = ort_session.open_session(_identity_graph(tmp_path / "model.onnx"))
    (got,) = ort_session.run_refusing(session, ["y"], {"x": np.ones(1, np.float32)}, "refused")
    np.testing.assert_array_equal(got, [1.0])
    with pytest.raises(AnyformerError) as caught:
        ort_session.run_refusing(session, ["y"], {"x": np.ones(3, np.float32)}, "the graph refused 3 values")
    assert caught.value.code == ErrorCode.BAD_REQUEST
    message = str(caught.value)
    assert "the graph refused 3 values: [ONNXRuntimeError]" in message and "\n" not in message
    assert "dimension" in message.lower()  # onnxruntime's own words for the shape it was not exported for

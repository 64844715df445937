"""The core's validator runs before onnxruntime opens a graph: hostile external data is BAD_MODEL."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.session.ort_session import open_session


def _graph_with_external_data(folder: Path, location: str) -> Path:
    """A one-node graph (Y = X + W) whose weight W lives in external data at ``location``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.arange(4, dtype=np.float32), name="W")
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "W"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="model.onnx_data", size_threshold=0)
    if location != "model.onnx_data":
        loaded = onnx.load(str(path), load_external_data=False)
        for entry in loaded.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = location
        onnx.save_model(loaded, str(path))
    return path


def test_a_valid_graph_with_external_data_opens(tmp_path: Path) -> None:
    session, provider = open_session(_graph_with_external_data(tmp_path, "model.onnx_data"))
    assert provider == "CPUExecutionProvider"
    (out,) = session.run(None, {"X": np.ones(4, dtype=np.float32)})
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_external_data_outside_the_folder_is_bad_model(tmp_path: Path, location: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    path = _graph_with_external_data(folder, "model.onnx_data")
    shutil.copyfile(folder / "model.onnx_data", tmp_path / "secret.bin")
    path = _graph_with_external_data(folder, location)
    with pytest.raises(AnyformerError) as caught:
        open_session(path)
    assert caught.value.code == ErrorCode.BAD_MODEL


def test_a_hardlinked_data_file_is_bad_model(tmp_path: Path) -> None:
    path = _graph_with_external_data(tmp_path, "model.onnx_data")
    (tmp_path / "elsewhere.bin").hardlink_to(tmp_path / "model.onnx_data")
    with pytest.raises(AnyformerError) as caught:
        open_session(path)
    assert caught.value.code == ErrorCode.BAD_MODEL


def test_a_file_that_is_not_onnx_is_bad_model(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(AnyformerError) as caught:
        open_session(path)
    assert caught.value.code == ErrorCode.BAD_MODEL


def test_a_graph_onnxruntime_rejects_is_bad_model(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NoSuchOperator", ["X"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])],
    )
    path = tmp_path / "model.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(AnyformerError) as caught:
        open_session(path)
    assert caught.value.code == ErrorCode.BAD_MODEL
    assert "onnxruntime cannot open it" in caught.value.message

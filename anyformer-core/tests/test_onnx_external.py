"""The ONNX protobuf walk and external-data checks against SAFETY.md O1."""

from __future__ import annotations

import os
import random
import time
import tracemalloc
from pathlib import Path

import pytest
from hostile_files import (
    nested_onnx_graphs,
    onnx_graph,
    onnx_model,
    onnx_node_with_graph,
    onnx_node_with_tensor,
    onnx_tensor,
    pb_bytes,
    pb_varint,
    valid_gguf,
    varint,
)

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.files._onnx_external import MAX_DEPTH, check_onnx_external_data, read_onnx_summary

needs_symlinks = pytest.mark.skipif(os.name == "nt", reason="symlinks need privileges on Windows")


def bad(call: object, *fragments: str) -> None:
    """Assert that ``call()`` raises BAD_MODEL whose message holds every fragment."""
    __tracebackhide__ = True
    with pytest.raises(AnyformerError) as info:
        call()  # type: ignore[operator]
    err = info.value
    assert err.code is ErrorCode.BAD_MODEL, f"code was {err.code}, expected BAD_MODEL"
    for fragment in fragments:
        assert fragment in err.message, f"message {err.message!r} does not say {fragment!r}"


def model_with_data(folder: Path, location: str, *, data: bytes | None = b"\x00" * 16, **tensor: object) -> Path:
    """A model.onnx in ``folder`` with one initializer stored at ``location``, and that file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    path.write_bytes(onnx_model(onnx_graph([onnx_tensor("weight", location=location, **tensor)])))  # type: ignore[arg-type]
    if data is not None:
        (folder / location).write_bytes(data)
    return path


# The summary.


def test_summary_of_a_hand_encoded_model(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    graph = onnx_graph(
        [onnx_tensor("inline", raw_data=b"\x00" * 16), onnx_tensor("w1", location="weights.bin")],
        nodes=[onnx_node_with_tensor(onnx_tensor("const", location="const.bin"))],
    )
    path.write_bytes(
        onnx_model(
            graph,
            ir_version=9,
            producer="pytorch",
            opsets=[("", 17), ("com.microsoft", 1), ("", 13)],
            metadata=[("author", "me"), ("license", "mit")],
        )
    )
    summary = read_onnx_summary(path)
    assert summary.ir_version == 9
    assert summary.producer == "pytorch"
    assert summary.opsets == {"": 17, "com.microsoft": 1}
    assert summary.metadata == {"author": "me", "license": "mit"}
    assert summary.external_locations == ["const.bin", "weights.bin"]  # file order: the node comes first


def test_external_data_in_every_place_a_tensor_can_be(tmp_path: Path) -> None:
    sparse = pb_bytes(1, onnx_tensor("values", location="sparse_values.bin")) + pb_bytes(
        2, onnx_tensor("indices", location="sparse_indices.bin")
    )
    attr_tensors = pb_bytes(1, "ts") + pb_bytes(10, onnx_tensor("t_in_list", location="attr_list.bin"))
    attr_graphs = pb_bytes(1, "gs") + pb_bytes(11, onnx_graph([onnx_tensor("g_in_list", location="graph_list.bin")]))
    node = pb_bytes(5, attr_tensors) + pb_bytes(5, attr_graphs)
    graph = onnx_graph(nodes=[node]) + pb_bytes(15, sparse)
    subgraph = onnx_graph(nodes=[onnx_node_with_graph(onnx_graph([onnx_tensor("deep", location="deep.bin")]))])
    training = pb_bytes(1, onnx_graph([onnx_tensor("init", location="training.bin")]))
    function = pb_bytes(1, "f") + pb_bytes(7, onnx_node_with_tensor(onnx_tensor("fn", location="function.bin")))
    model = onnx_model(graph) + pb_bytes(7, subgraph) + pb_bytes(20, training) + pb_bytes(25, function)
    path = tmp_path / "model.onnx"
    path.write_bytes(model)
    assert sorted(read_onnx_summary(path).external_locations) == sorted(
        [
            "sparse_values.bin",
            "sparse_indices.bin",
            "attr_list.bin",
            "graph_list.bin",
            "deep.bin",
            "training.bin",
            "function.bin",
        ]
    )


def test_external_data_entries_without_external_location_are_ignored(tmp_path: Path) -> None:
    path = model_with_data(tmp_path, "../outside.bin", data=None, external=False)
    assert read_onnx_summary(path).external_locations == []
    assert check_onnx_external_data(path) == []


def test_deep_but_allowed_nesting(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(nested_onnx_graphs(20))
    (tmp_path / "w.bin").write_bytes(b"\x00" * 16)
    assert check_onnx_external_data(path) == [tmp_path / "w.bin"]


# Valid external data.


def test_external_data_inside_the_folder(tmp_path: Path) -> None:
    path = model_with_data(tmp_path, "weights.bin", offset=0, length=16)
    assert check_onnx_external_data(path) == [tmp_path / "weights.bin"]


def test_external_data_in_a_subfolder_and_dot_segments(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "w.bin").write_bytes(b"\x00" * 8)
    path = tmp_path / "model.onnx"
    graph = onnx_graph(
        [onnx_tensor("a", location="data/w.bin"), onnx_tensor("b", location="./data/../data/w.bin", offset=4)]
    )
    path.write_bytes(onnx_model(graph))
    assert check_onnx_external_data(path) == [tmp_path / "data" / "w.bin"]


@needs_symlinks
def test_symlink_inside_the_folder_is_fine(tmp_path: Path) -> None:
    path = model_with_data(tmp_path, "real.bin")
    graph = onnx_graph([onnx_tensor("w", location="alias.bin")])
    path.write_bytes(onnx_model(graph))
    (tmp_path / "alias.bin").symlink_to("real.bin")
    assert check_onnx_external_data(path) == [tmp_path / "alias.bin"]


# O1: ../, absolute, symlinks and hardlinks out of the folder.


@pytest.mark.parametrize("location", ["../secret.bin", "..", "a/../../secret.bin", "..\\secret.bin", "./../x"])
def test_o1_dot_dot_out_of_the_folder(tmp_path: Path, location: str) -> None:
    (tmp_path / "secret.bin").write_bytes(b"secret")
    path = model_with_data(tmp_path / "m", location, data=None)
    bad(lambda: check_onnx_external_data(path), "model.onnx:", "tensor 'weight'", "'..'")


@pytest.mark.parametrize("location", ["/etc/passwd", "//server/share/x", "C:\\Windows\\win.ini", "\\etc\\passwd"])
def test_o1_absolute_location(tmp_path: Path, location: str) -> None:
    path = model_with_data(tmp_path, location, data=None)
    bad(lambda: check_onnx_external_data(path), "tensor 'weight'", "absolute path")


@needs_symlinks
@pytest.mark.parametrize("target", ["secret.bin", "/etc/passwd", "sub/../secret.bin"])
def test_o1_symlink_out_of_the_folder(tmp_path: Path, target: str) -> None:
    (tmp_path / "secret.bin").write_bytes(b"secret" * 4)
    folder = tmp_path / "m"
    path = model_with_data(folder, "weights.bin", data=None)
    (folder / "weights.bin").symlink_to(tmp_path / target if not target.startswith("/") else target)
    bad(lambda: check_onnx_external_data(path), "'weights.bin'", "outside the model folder")


@needs_symlinks
def test_o1_symlinked_subfolder_out_of_the_folder(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "w.bin").write_bytes(b"\x00" * 16)
    folder = tmp_path / "m"
    path = model_with_data(folder, "data/w.bin", data=None)
    (folder / "data").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    bad(lambda: check_onnx_external_data(path), "'data/w.bin'", "outside the model folder")


def test_o1_hardlink_to_a_file_outside(tmp_path: Path) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"secret" * 4)
    folder = tmp_path / "m"
    path = model_with_data(folder, "weights.bin", data=None)
    try:
        os.link(secret, folder / "weights.bin")
    except OSError as exc:
        pytest.skip(f"no hardlinks here: {exc}")
    bad(lambda: check_onnx_external_data(path), "'weights.bin'", "hardlink", "2 links")


def test_o1_missing_external_data(tmp_path: Path) -> None:
    path = model_with_data(tmp_path, "weights.bin", data=None)
    bad(lambda: check_onnx_external_data(path), "'weights.bin'", "missing")


@needs_symlinks
def test_o1_dangling_symlink(tmp_path: Path) -> None:
    path = model_with_data(tmp_path, "weights.bin", data=None)
    (tmp_path / "weights.bin").symlink_to(tmp_path / "gone.bin")
    bad(lambda: check_onnx_external_data(path), "'weights.bin'", "missing")


def test_o1_directory_as_external_data(tmp_path: Path) -> None:
    path = model_with_data(tmp_path, "weights", data=None)
    (tmp_path / "weights").mkdir()
    bad(lambda: check_onnx_external_data(path), "'weights'", "not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_o1_fifo_as_external_data(tmp_path: Path) -> None:
    path = model_with_data(tmp_path, "weights.bin", data=None)
    os.mkfifo(tmp_path / "weights.bin")
    bad(lambda: check_onnx_external_data(path), "not a regular file")


@pytest.mark.parametrize(
    ("tensor", "fault"),
    [
        ({"offset": 8, "length": 16}, "runs past its 16 bytes"),
        ({"offset": 17}, "runs past"),
        ({"length": 17}, "runs past"),
    ],
)
def test_o1_range_past_the_file(tmp_path: Path, tensor: dict[str, int], fault: str) -> None:
    path = model_with_data(tmp_path, "weights.bin", **tensor)  # type: ignore[arg-type]
    bad(lambda: check_onnx_external_data(path), "'weights.bin'", fault)


def test_o1_non_numeric_offset(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    (tmp_path / "w.bin").write_bytes(b"\x00" * 16)
    tensor = (
        pb_bytes(8, "t")
        + pb_bytes(13, pb_bytes(1, "location") + pb_bytes(2, "w.bin"))
        + pb_bytes(13, pb_bytes(1, "offset") + pb_bytes(2, "-4"))
        + pb_varint(14, 1)
    )
    path.write_bytes(onnx_model(onnx_graph([tensor])))
    bad(lambda: check_onnx_external_data(path), "offset '-4' is not a non-negative integer")


@pytest.mark.parametrize("location", ["", "w\x00.bin", "."])
def test_o1_empty_or_odd_location(tmp_path: Path, location: str) -> None:
    path = model_with_data(tmp_path, "w.bin")
    path.write_bytes(onnx_model(onnx_graph([onnx_tensor("weight", location=location)])))
    bad(lambda: check_onnx_external_data(path), "tensor 'weight'")


def test_o1_location_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    entry = pb_bytes(1, "location") + pb_bytes(2, b"\xff.bin")
    path.write_bytes(onnx_model(onnx_graph([pb_bytes(8, "t") + pb_bytes(13, entry) + pb_varint(14, 1)])))
    bad(lambda: read_onnx_summary(path), "external_data value is not valid UTF-8")


# O1: the Hugging Face hub cache, where snapshot files are symlinks into blobs/.


def hub_cache(root: Path, repo: str = "models--org--name") -> tuple[Path, Path]:
    """A hub-cache repo folder with a snapshot whose model and data are symlinks into blobs/."""
    repo_dir = root / "hub" / repo
    blobs = repo_dir / "blobs"
    snapshot = repo_dir / "snapshots" / "0123abcd" / "onnx"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (blobs / "aaaa").write_bytes(onnx_model(onnx_graph([onnx_tensor("weight", location="model.onnx_data")])))
    (blobs / "bbbb").write_bytes(b"\x00" * 16)
    (snapshot / "model.onnx").symlink_to(os.path.relpath(blobs / "aaaa", snapshot))
    (snapshot / "model.onnx_data").symlink_to(os.path.relpath(blobs / "bbbb", snapshot))
    return snapshot, blobs


@needs_symlinks
def test_o1_hub_cache_blob_symlinks_are_legitimate(tmp_path: Path) -> None:
    snapshot, _ = hub_cache(tmp_path)
    assert check_onnx_external_data(snapshot / "model.onnx") == [snapshot / "model.onnx_data"]
    assert read_onnx_summary(snapshot / "model.onnx").external_locations == ["model.onnx_data"]


@needs_symlinks
def test_o1_hub_cache_symlink_into_another_repos_blobs(tmp_path: Path) -> None:
    snapshot, _ = hub_cache(tmp_path)
    _, other_blobs = hub_cache(tmp_path, "models--evil--repo")
    (other_blobs / "cccc").write_bytes(b"\x00" * 16)
    (snapshot / "model.onnx_data").unlink()
    (snapshot / "model.onnx_data").symlink_to(other_blobs / "cccc")
    bad(lambda: check_onnx_external_data(snapshot / "model.onnx"), "outside the model folder")


@needs_symlinks
def test_o1_hub_cache_symlink_out_of_the_cache(tmp_path: Path) -> None:
    snapshot, _ = hub_cache(tmp_path)
    (tmp_path / "secret").write_bytes(b"\x00" * 16)
    (snapshot / "model.onnx_data").unlink()
    (snapshot / "model.onnx_data").symlink_to(tmp_path / "secret")
    bad(lambda: check_onnx_external_data(snapshot / "model.onnx"), "outside the model folder")


@needs_symlinks
def test_o1_hub_cache_hardlinked_blob(tmp_path: Path) -> None:
    snapshot, blobs = hub_cache(tmp_path)
    try:
        os.link(blobs / "bbbb", tmp_path / "copy")
    except OSError as exc:
        pytest.skip(f"no hardlinks here: {exc}")
    bad(lambda: check_onnx_external_data(snapshot / "model.onnx"), "hardlink")


@needs_symlinks
def test_o1_model_symlink_out_of_its_folder(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    model_with_data(elsewhere, "w.bin")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "w.bin").write_bytes(b"\x00" * 16)
    (folder / "model.onnx").symlink_to(elsewhere / "model.onnx")
    bad(lambda: check_onnx_external_data(folder / "model.onnx"), "the model file is a link", "outside its folder")


# Not ONNX, or hostile protobuf.


@pytest.mark.parametrize(
    ("data", "fault"),
    [
        (b"", "empty file"),
        (b"hello world, this is not a model\n", ""),
        (valid_gguf(), ""),
        (b"\x08", "truncated varint"),
        (b"\x08" + b"\xff" * 11, "varint longer than 10 bytes"),
        (b"\x0b", "wire type 3"),
        (b"\x0e\x00", "wire type 6"),
        (b"\x00\x01", "field number 0"),
        (pb_bytes(2, "producer"), "no ir_version"),
        (varint(7 << 3 | 2) + varint(2**40) + b"\x00", "claims 1099511627776 bytes"),
        (pb_bytes(1, "x"), "field 1 of ModelProto has wire type 2, expected 0"),
        (pb_varint(7, 1), "field 7 of ModelProto has wire type 0, expected 2"),
        (pb_varint(1, 8) + varint(7 << 3 | 1) + b"\x00" * 3, "truncated fixed-width"),
    ],
)
def test_not_onnx_is_bad_model(tmp_path: Path, data: bytes, fault: str) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    bad(lambda: read_onnx_summary(path), "model.onnx:", fault)
    bad(lambda: check_onnx_external_data(path), "model.onnx:", fault)


def test_nesting_too_deep_is_refused_without_recursion(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(nested_onnx_graphs(MAX_DEPTH))
    start = time.perf_counter()
    bad(lambda: read_onnx_summary(path), f"nested deeper than {MAX_DEPTH}")
    assert time.perf_counter() - start < 1.0


def test_deeply_nested_unknown_fields_are_skipped_flat(tmp_path: Path) -> None:
    # Unknown length-delimited fields are skipped as bytes, so their nesting costs nothing.
    blob = b""
    for _ in range(3000):
        blob = pb_bytes(99, blob)
    path = tmp_path / "model.onnx"
    path.write_bytes(onnx_model(onnx_graph()) + blob)
    assert read_onnx_summary(path).ir_version == 8


def test_missing_model(tmp_path: Path) -> None:
    bad(lambda: read_onnx_summary(tmp_path / "absent.onnx"), "absent.onnx: cannot read")
    bad(lambda: check_onnx_external_data(tmp_path / "absent.onnx"), "absent.onnx: cannot read")


@pytest.mark.parametrize("seed", range(5))
def test_random_mutations_only_raise_bad_model(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    graph = onnx_graph(
        [onnx_tensor("inline", raw_data=b"\x01" * 16), onnx_tensor("w", location="w.bin", offset=0, length=16)],
        nodes=[onnx_node_with_graph(onnx_graph([onnx_tensor("deep", location="w.bin")]))],
    )
    original = onnx_model(graph, metadata=[("k", "v")])
    (tmp_path / "w.bin").write_bytes(b"\x00" * 16)
    path = tmp_path / "model.onnx"
    for _ in range(200):
        mutated = bytearray(original)
        pos = rng.randrange(len(mutated))
        if rng.random() < 0.8:
            mutated[pos] = rng.randrange(256)
        else:
            del mutated[pos:]
        path.write_bytes(bytes(mutated))
        try:
            check_onnx_external_data(path)
        except AnyformerError as exc:
            assert exc.code is ErrorCode.BAD_MODEL


def test_many_sibling_messages_cost_no_memory(tmp_path: Path) -> None:
    # 50,000 empty nodes: the walk keeps one iterator per nesting level, not one entry per node.
    path = tmp_path / "model.onnx"
    path.write_bytes(onnx_model(pb_bytes(1, b"") * 50_000))
    tracemalloc.start()
    summary = read_onnx_summary(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert summary.external_locations == []
    assert peak < 1024 * 1024, f"peak memory {peak} bytes"

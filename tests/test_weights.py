"""models/weights.py: a model's graph apart from its weights, and its constants folded once."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import FIXTURE_MODELS
from hayakoe_pi.models.folders import save_graph
from hayakoe_pi.models.sessions import prepare_options
from hayakoe_pi.models.unsigned import unsigned_integer_weights
from hayakoe_pi.models.weights import ALIGN, FOLDED_NAME, WEIGHTS_NAME, UnreadableModel, fold_constants, weightless
from hayakoe_pi.models.wire import MIN_EXTERNAL_BYTES, shared_weights

BERT = FIXTURE_MODELS / "onnx" / "bert" / "q8" / "bert_q8.onnx"
SYNTH = FIXTURE_MODELS / "onnx" / "speakers" / "tiny-voice" / "synthesizer.onnx"


def _tensors(path):
    model = onnx.load(str(path))  # external data loaded from beside the graph
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("source", [BERT, SYNTH], ids=["bert", "synthesizer"])
def test_the_graph_apart_holds_the_same_tensors_at_mappable_offsets(source, tmp_path):
    model = weightless(source, tmp_path)
    external = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert external and all(not t.raw_data for t in external)
    offsets = [int({e.key: e.value for e in t.external_data}["offset"]) for t in external]
    lengths = [int({e.key: e.value for e in t.external_data}["length"]) for t in external]
    assert all(o % ALIGN == 0 for o, n in zip(offsets, lengths) if n >= ALIGN)
    assert all(n >= MIN_EXTERNAL_BYTES for n in lengths)
    save_graph(model, tmp_path / "g.onnx")
    assert (tmp_path / "g.onnx").stat().st_size < source.stat().st_size / 4
    want, got = _tensors(source), _tensors(tmp_path / "g.onnx")
    assert want.keys() == got.keys()
    assert all(np.array_equal(want[k], got[k]) and want[k].dtype == got[k].dtype for k in want)


def test_int64_tensors_stay_in_the_graph_where_shape_inference_reads_them(tmp_path):
    index = numpy_helper.from_array(np.arange(512, dtype=np.int64), "index")  # 4 KB
    weight = numpy_helper.from_array(np.ones(1024, np.float32), "weight")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["weight", "index"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512])], [index, weight])
    source = tmp_path / "model.onnx"
    onnx.save_model(helper.make_model(graph), str(source))
    places = {t.name: t.data_location for t in weightless(source, tmp_path).graph.initializer}
    assert places == {"index": TensorProto.DEFAULT, "weight": TensorProto.EXTERNAL}


def test_shared_weights_are_the_graphs_tensors_over_one_map(tmp_path):
    save_graph(weightless(SYNTH, tmp_path), tmp_path / "g.onnx")
    shared, want = shared_weights(tmp_path / "g.onnx"), _tensors(tmp_path / "g.onnx")
    graph = onnx.load(str(tmp_path / "g.onnx"), load_external_data=False).graph
    assert set(shared) == {t.name for t in graph.initializer if t.data_location == TensorProto.EXTERNAL}
    for name, array in shared.items():
        assert array.dtype == want[name].dtype and np.array_equal(array, want[name])
        assert isinstance(array.base, np.memmap) and not array.flags.writeable


def test_a_model_keeping_its_weights_apart_already_is_read_whole(tmp_path):
    source = tmp_path / "src" / "model.onnx"
    source.parent.mkdir()
    onnx.save_model(onnx.load(str(BERT)), str(source), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="data.bin", size_threshold=0)
    folder = tmp_path / "out"
    folder.mkdir()
    save_graph(weightless(source, folder), folder / "g.onnx")
    want, got = _tensors(BERT), _tensors(folder / "g.onnx")
    assert all(np.array_equal(want[k], got[k]) for k in want)


def test_a_truncated_model_is_reported_as_unreadable(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(SYNTH.read_bytes()[: SYNTH.stat().st_size // 2])
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(UnreadableModel):
        weightless(broken, folder)


def _with_constants():
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    shape = numpy_helper.from_array(np.array([32, 64], np.int64), "shape")
    rows, cols = (numpy_helper.from_array(np.array([v], np.int64), n) for v, n in ((-1, "rows"), (32, "cols")))
    nodes = [
        helper.make_node("Concat", ["rows", "cols"], ["out_shape"], axis=0),  # folded; shape inference reads it
        helper.make_node("Mul", ["w", "scale"], ["w_scaled"]),  # constant: folded
        helper.make_node("Transpose", ["w_scaled"], ["w_t"]),  # constant: folded
        helper.make_node("Reshape", ["w_t", "shape"], ["w_r"]),  # constant, int64 shape input
        helper.make_node("MatMul", ["x", "w_scaled"], ["y0"]),
        helper.make_node("Gemm", ["x", "w_r"], ["y1"], transB=1),
        helper.make_node("Add", ["y0", "y1"], ["y2"]),
        helper.make_node("Reshape", ["y2", "out_shape"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])],
                              [w, scale, shape, rows, cols])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_constants_are_folded_once_and_give_the_same_result(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(_with_constants(), str(source))
    folder = tmp_path / "out"
    folder.mkdir()
    model = weightless(source, folder)
    fold_constants(model, folder, prepare_options)
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["MatMul", "Gemm", "Add", "Reshape"]  # what depended on weights alone is gone
    assert (folder / FOLDED_NAME).is_file() and not list(folder.glob("folding*"))
    save_graph(model, folder / "g.onnx")
    x = np.random.default_rng(4).standard_normal((5, 64)).astype(np.float32)
    run = lambda path: ort.InferenceSession(str(path), prepare_options(),
                                            providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.array_equal(run(source), run(folder / "g.onnx"))
    assert (folder / WEIGHTS_NAME).is_file()


def test_integer_products_with_unsigned_weights_are_exact_and_the_same(tmp_path):
    """Signed 8-bit weights made unsigned (value and zero point + 128): exactly the
    products of the model as published, on any CPU; an x86 CPU without VNNI computes the
    published (uint8 × int8) form with saturation, and this test then sees it."""
    rng = np.random.default_rng(0)
    depth, columns = 256, 32
    w1 = rng.choice(np.array([-128, -127, 126, 127], np.int8), (depth, columns))  # products that saturate
    w2 = rng.integers(-128, 128, (depth, columns), dtype=np.int8)
    shared = rng.integers(-128, 128, (depth, columns), dtype=np.int8)  # read by a product and by a Cast
    zero, zero3 = np.array(-3, np.int8), np.array(5, np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w1", "", "zero"], ["y1"]),
         helper.make_node("MatMulInteger", ["a", "w2"], ["y2"]),
         helper.make_node("MatMulInteger", ["a", "w2", "", "zero"], ["y3"]),  # w2 with and without one
         helper.make_node("MatMulInteger", ["a", "shared", "", "zero3"], ["y4"]),
         helper.make_node("Cast", ["shared"], ["z"], to=TensorProto.INT32)], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, depth])],
        [helper.make_tensor_value_info(name, TensorProto.INT32, None) for name in ("y1", "y2", "y3", "y4", "z")],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(zero, "zero"),
         numpy_helper.from_array(shared, "shared"), numpy_helper.from_array(zero3, "zero3")])
    source = tmp_path / "model.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(source))
    folder = tmp_path / "prepared"
    model = weightless(source, folder)
    assert unsigned_integer_weights(model, folder) == 2
    assert unsigned_integer_weights(model, folder) == 0  # done already: never flipped back
    save_graph(model, folder / "g.onnx")
    types = {t.name: t.data_type for t in onnx.load(str(folder / "g.onnx"), load_external_data=False).graph.initializer}
    assert {name: types[name] for name in ("w1", "w2", "zero", "shared", "zero3")} == {
        "w1": TensorProto.UINT8, "w2": TensorProto.UINT8, "zero": TensorProto.UINT8,
        "shared": TensorProto.INT8, "zero3": TensorProto.INT8}

    a = np.concatenate([np.full((2, depth), 255, np.uint8), rng.integers(0, 256, (2, depth), dtype=np.uint8)])
    session = ort.InferenceSession(str(folder / "g.onnx"), providers=["CPUExecutionProvider"])
    y1, y2, y3, _, z = session.run(None, {"a": a})
    exact = lambda w, z0=0: a.astype(np.int64) @ (w.astype(np.int64) - z0)  # noqa: E731
    assert np.array_equal(y1, exact(w1, -3)) and np.array_equal(y2, exact(w2)) and np.array_equal(y3, exact(w2, -3))
    assert np.array_equal(z, shared.astype(np.int32))


def test_a_prepared_copy_is_checked_against_what_it_was_when_made(tmp_path):
    """checksums.py: a copy's files recorded as made; the quick check (each start) sees a file
    cut short or garbled where it samples, the full one (check, prepare) any byte."""
    import os

    from hayakoe_pi.models import checksums

    rng = np.random.default_rng(5)
    copy, weights = tmp_path / "g.cpu.onnx", tmp_path / "g.cpu.onnx.weights"
    copy.write_bytes(rng.bytes(20_000))
    weights.write_bytes(rng.bytes(8 * checksums.SAMPLE_WHOLE_BYTES))  # sampled, not read whole
    assert checksums.damage(copy) is None and not checksums.recorded(copy)  # made before records
    checksums.adopt(copy)  # recorded as it is
    assert checksums.damage(copy) is None and checksums.damage(copy, full=True) is None
    size, last = weights.stat().st_size, weights.stat().st_size - checksums.SAMPLE_BLOCK
    sampled = [last * i // (checksums.SAMPLE_BLOCKS - 1) for i in range(checksums.SAMPLE_BLOCKS)]
    between = (sampled[10] + sampled[11]) // 2  # no sampled block reads it

    def garble(path, at):
        fd = os.open(path, os.O_RDWR)
        before = os.pread(fd, 1, at)
        os.pwrite(fd, bytes([before[0] ^ 0xFF]), at)
        os.close(fd)

    garble(weights, between)
    assert checksums.damage(copy) is None
    assert checksums.damage(copy, full=True) == f"{weights} is damaged: its SHA-256 is not the one recorded when it was made"
    garble(weights, between)
    garble(weights, size - 1)  # in the last block, sampled
    assert "SHA-256" in checksums.damage(copy)
    garble(weights, size - 1)
    garble(copy, 12_345)  # a graph is small: read whole, even by the quick check
    assert str(copy) in checksums.damage(copy)
    garble(copy, 12_345)
    os.truncate(weights, size // 2)  # what a power cut leaves
    assert checksums.damage(copy) == f"{weights} is damaged: {size // 2} bytes, {size} when it was made"
    checksums.remove(copy)
    assert not list(tmp_path.iterdir())

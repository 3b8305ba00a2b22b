"""The decoder cut out of synthesizer.onnx, and its 2-D form."""

import json
import platform
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import FIXTURE_MODELS
from hayakoe_pi.models import forms, split
from hayakoe_pi.models import rows as row_rewrite
from hayakoe_pi.models.forms import decoder_as_2d
from hayakoe_pi.models.polyphase import as_convolutions
from hayakoe_pi.models.sessions import _session_options
from hayakoe_pi.models.store import ModelStore

RNG = np.random.default_rng(1)


def _decoder(extra_nodes=(), extra_inits=(), opset=17):
    """A small HiFi-GAN-like graph: conv, transposed conv, leaky ReLU, residual add, tanh."""
    inits = [
        numpy_helper.from_array(RNG.standard_normal((4, 3, 5)).astype(np.float32), "pre.w"),
        numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "pre.b"),
        numpy_helper.from_array(RNG.standard_normal((4, 2, 4)).astype(np.float32), "up.w"),
        numpy_helper.from_array(RNG.standard_normal((2, 2, 3)).astype(np.float32), "res.w"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        *extra_inits,
    ]
    nodes = [
        helper.make_node("Conv", ["z", "pre.w", "pre.b"], ["a"], pads=[2, 2], kernel_shape=[5]),
        helper.make_node("LeakyRelu", ["a"], ["b"], alpha=0.1),
        helper.make_node("ConvTranspose", ["b", "up.w"], ["c"], strides=[2], pads=[1, 1]),
        helper.make_node("Conv", ["c", "res.w"], ["d"], pads=[3, 3], dilations=[3]),
        helper.make_node("Add", ["c", "d"], ["e"]),
        helper.make_node("Mul", ["e", "half"], ["f"]),
        *extra_nodes,
        helper.make_node("Tanh", ["f" if not extra_nodes else extra_nodes[-1].output[0]], ["audio"]),
    ]
    graph = helper.make_graph(
        nodes, "decoder", [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3, "t"])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 2, "s"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model, z):
    # the options the engine uses: other tests in this process set up ORT's shared thread pool
    opts = _session_options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return session.run(None, {"z": z})[0]


@pytest.mark.parametrize("opset", [11, 17])
def test_2d_form_gives_the_same_samples(opset):
    model = _decoder(opset=opset)
    z = RNG.standard_normal((1, 3, 37)).astype(np.float32)
    expected = _run(model, z)
    flat = onnx.ModelProto()
    flat.CopyFrom(model)
    as_2d = decoder_as_2d(flat)
    assert as_2d is not None
    assert all(len(helper.get_attribute_value(a)) == 2 for n in as_2d.graph.node
               for a in n.attribute if a.name == "kernel_shape")
    got = _run(as_2d, z)
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1e-5


def _conv_ranks(model) -> list[int]:
    """Rank of each convolution's input: 3 for 1-D, 4 for 2-D."""
    inferred = onnx.shape_inference.infer_shapes(model)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in
             [*inferred.graph.input, *inferred.graph.value_info]}
    return [ranks[n.input[0]] for n in inferred.graph.node if n.op_type == "Conv"]


@pytest.mark.parametrize("opset", [11, 17])
def test_wide_2d_form_keeps_narrow_convolutions_1d_with_the_same_samples(opset):
    model = _decoder(opset=opset)  # its convolutions read 3 (pre) and 2 (res) channels
    z = RNG.standard_normal((1, 3, 37)).astype(np.float32)
    expected = _run(model, z)

    def rewritten(min_channels):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return decoder_as_2d(copy, min_channels)

    wide = rewritten(3)
    assert wide is not None and _conv_ranks(wide) == [4, 3]
    got = _run(wide, z)
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 1e-5
    # a form that would be the 1-D one or the whole 2-D one is not made again
    assert rewritten(4) is None and rewritten(2) is None


def _staged_decoder(skip_from_before_the_cut=False, opset=17):
    """Two upsampling stages: 8 channels, then 4 (the narrow one) with a dilated residual block."""
    w = lambda *shape: RNG.standard_normal(shape).astype(np.float32) * 0.3  # noqa: E731
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("pre.w", w(8, 3, 5)), ("up1.w", w(8, 8, 16)), ("up2.w", w(8, 4, 4)), ("up2.b", w(4)),
        ("res.w", w(4, 4, 3)), ("post.w", w(1, 4, 7)), ("half", np.array(0.5, np.float32))]]
    nodes = [
        helper.make_node("Conv", ["z", "pre.w"], ["a"], pads=[2, 2]),
        helper.make_node("ConvTranspose", ["a", "up1.w"], ["b"], strides=[8], pads=[4, 4]),
        helper.make_node("LeakyRelu", ["b"], ["c"], alpha=0.1),
        helper.make_node("ConvTranspose", ["c", "up2.w", "up2.b"], ["d"], strides=[2], pads=[1, 1]),
        helper.make_node("LeakyRelu", ["d"], ["e"], alpha=0.1),
        helper.make_node("Conv", ["e", "res.w"], ["f"], pads=[3, 3], dilations=[3]),
        helper.make_node("Add", ["d", "f"], ["g"]),
        helper.make_node("Mul", ["g", "half"], ["h"]),
        helper.make_node("Conv", ["h", "post.w"], ["i"], pads=[3, 3]),
        # a skip from before the cut (b, not c): the narrow stage then needs more than the cut
        *([helper.make_node("ConvTranspose", ["b", "up2.w"], ["skip"], strides=[2], pads=[1, 1]),
           helper.make_node("Conv", ["skip", "post.w"], ["skip1"], pads=[3, 3]),
           helper.make_node("Add", ["i", "skip1"], ["i2"])] if skip_from_before_the_cut else []),
        helper.make_node("Tanh", ["i2" if skip_from_before_the_cut else "i"], ["audio"]),
    ]
    graph = helper.make_graph(
        nodes, "decoder", [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3, "t"])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1, "s"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _in_rows(model, rows, below_channels=8):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return row_rewrite.decoder_in_rows(decoder_as_2d(copy), rows, below_channels)


@pytest.mark.parametrize("rows", [2, 3])
def test_narrow_stages_in_rows_give_the_same_samples(rows):
    model = _staged_decoder()
    in_rows = _in_rows(model, rows)
    assert in_rows is not None
    stacked = [n for n in in_rows.graph.node if n.op_type == "Concat" and len(n.input) == rows
               and helper.get_attribute_value(n.attribute[0]) == 2]  # the rows, stacked along the height
    [narrow_upsampling] = [n for n in in_rows.graph.node if n.op_type == "ConvTranspose" and n.input[2:] == ["up2.b"]]
    assert stacked and narrow_upsampling.input[0] == stacked[0].output[0]
    for frames in (1, 2, 5, 37):  # short ones get full-length rows
        z = RNG.standard_normal((1, 3, frames)).astype(np.float32)
        expected, got = _run(model, z), _run(in_rows, z)
        assert got.shape == expected.shape
        assert np.abs(got - expected).max() <= 1e-5, frames


def test_rows_take_the_margin_their_layers_reach(monkeypatch):
    model = _staged_decoder()
    z = RNG.standard_normal((1, 3, 37)).astype(np.float32)
    plan = row_rewrite._rows_plan

    def no_margin(graph, below):
        cut, after, margin, up = plan(graph, below)
        return cut, after, 0, up

    monkeypatch.setattr(row_rewrite, "_rows_plan", no_margin)
    # without it, the samples beside a row's end are wrong: what the margin is there for
    assert np.abs(_run(_in_rows(model, 2), z) - _run(model, z)).max() > 1e-3


def test_decoders_it_cannot_put_in_rows_are_left_alone():
    for model, rows, below in [(_staged_decoder(skip_from_before_the_cut=True), 2, 8),
                               (_staged_decoder(), 2, 4),  # no stage narrower than 4 channels
                               (_staged_decoder(), 2, 9),  # a cut before the first stage: margin too wide
                               (_staged_decoder(), 1, 8),
                               (_staged_decoder(opset=13), 2, 8)]:  # Shape(start, end) needs opset 15
        as_2d = decoder_as_2d(model)
        before = as_2d.SerializeToString()
        assert row_rewrite.decoder_in_rows(as_2d, rows, below) is None
        assert as_2d.SerializeToString() == before


def test_graphs_it_cannot_rewrite_are_left_alone():
    reshape = _decoder([helper.make_node("Reshape", ["f", "shape"], ["g"])],
                       [numpy_helper.from_array(np.array([1, 2, -1], np.int64), "shape")])
    per_channel = _decoder([helper.make_node("Add", ["f", "bias"], ["g"])],
                           [numpy_helper.from_array(np.ones((2, 1), np.float32), "bias")])
    # right-aligned broadcasting of a [2, 1] operand would change meaning in 4-D
    assert decoder_as_2d(reshape) is None
    assert decoder_as_2d(per_channel) is None


def _upsampler(kernel: int, stride: int, pads: list[int], bias: bool):
    inits = [numpy_helper.from_array(RNG.standard_normal((3, 2, kernel)).astype(np.float32), "up.w")]
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(2).astype(np.float32), "up.b"))
    node = helper.make_node("ConvTranspose", ["z", "up.w", *(["up.b"] if bias else [])], ["audio"],
                            strides=[stride], pads=pads)
    graph = helper.make_graph([node], "up", [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3, "t"])],
                              [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 2, "s"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# the decoder's upsamplers (kernel, stride, pads) and others the rewrite must get right
@pytest.mark.parametrize("kernel,stride,pads,bias", [(16, 8, [4, 4], True), (8, 2, [3, 3], True),
                                                    (2, 2, [0, 0], True), (4, 2, [1, 1], False),
                                                    (6, 3, [2, 1], True), (3, 1, [1, 1], False)])
def test_transposed_convolutions_as_convolutions_give_the_same_samples(kernel, stride, pads, bias):
    model = _upsampler(kernel, stride, pads, bias)
    for frames in (1, 2, 37):
        z = RNG.standard_normal((1, 3, frames)).astype(np.float32)
        expected = _run(model, z)
        rewritten = onnx.ModelProto()
        rewritten.CopyFrom(model)
        assert as_convolutions(rewritten) == 1
        assert "ConvTranspose" not in {n.op_type for n in rewritten.graph.node}
        assert "up.w" not in {t.name for t in rewritten.graph.initializer}  # not kept beside its rewrite
        got = _run(rewritten, z)
        assert got.shape == expected.shape and np.abs(got - expected).max() < 1e-5


def test_transposed_convolutions_it_cannot_rewrite_are_left_alone():
    uneven = _upsampler(5, 2, [1, 1], True)  # a kernel that is no multiple of the stride
    assert as_convolutions(uneven) == 0 and uneven.graph.node[0].op_type == "ConvTranspose"
    model = _decoder()  # a whole little decoder: its one upsampler rewritten, the same samples
    z = RNG.standard_normal((1, 3, 37)).astype(np.float32)
    expected = _run(model, z)
    assert as_convolutions(model) == 1
    assert np.abs(_run(model, z) - expected).max() < 1e-5


@pytest.mark.prepares_models
def test_fixture_decoder_is_cut_in_both_forms(tmp_path):
    if not forms.blocked_conv_kernels():
        pytest.skip("no 2-D form where ONNX Runtime has no blocked kernels (the next test)")
    ModelStore(FIXTURE_MODELS, derived_dir=tmp_path).voice("tiny-voice")  # as the engine loads it
    [stamp] = [p for p in tmp_path.glob("*/prepared.json") if json.loads(p.read_text())["kind"] == "split"]
    assert json.loads(stamp.read_text())["forms"] == ["1d", "2d"]  # the 2-D form gave the same samples
    decoder = onnx.load(str(stamp.parent / "decoder-2d.onnx"), load_external_data=False)
    kernels = [helper.get_attribute_value(a) for n in decoder.graph.node if n.op_type == "Conv"
               for a in n.attribute if a.name == "kernel_shape"]
    assert kernels and all(len(k) == 2 and k[0] == 1 for k in kernels)
    # the engine's decoder still takes [1, channels, frames] (test_engine checks its samples)
    assert len(decoder.graph.input[0].type.tensor_type.shape.dim) == 3


@pytest.mark.prepares_models
def test_fixture_decoder_has_a_wide_2d_form_where_it_has_wide_convolutions(tmp_path, monkeypatch):
    # the fixture's decoder is narrow (at most 32 channels): with a lower bar it has a wide part
    monkeypatch.setitem(forms.TWO_D_FROM, "2d-wide", 32)
    monkeypatch.setattr(forms, "blocked_conv_kernels", lambda: True)  # the rewrite, on any CPU
    source = FIXTURE_MODELS / "onnx" / "speakers" / "tiny-voice" / "synthesizer.onnx"
    options = lambda: _session_options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)  # noqa: E731
    parts = split.split_synthesizer(source, tmp_path, options)
    assert list(parts.decoders) == ["1d", "2d", "2d-wide"]
    ranks = _conv_ranks(onnx.load(str(parts.decoders["2d-wide"]), load_external_data=False))
    assert 3 in ranks and 4 in ranks  # and it gave the same samples, or the split would not keep it


@pytest.mark.prepares_models
def test_fixture_decoder_runs_its_narrow_stages_in_rows(tmp_path, monkeypatch):
    # the fixture's stages have 32, 16, 8, 4 and 2 channels: rows from the 4-channel one,
    # where the reach left is under a latent frame (as from 64 channels in a full-size voice)
    monkeypatch.setattr(forms, "ROWS_BELOW_CHANNELS", 8)
    monkeypatch.setattr(forms, "blocked_conv_kernels", lambda: True)
    source = FIXTURE_MODELS / "onnx" / "speakers" / "tiny-voice" / "synthesizer.onnx"
    options = lambda: _session_options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)  # noqa: E731
    parts = split.split_synthesizer(source, tmp_path, options)
    assert "2d" in parts.decoders  # it gave the same samples, or the split would not keep it
    decoder = onnx.load(str(parts.decoders["2d"]), load_external_data=False)
    assert [n for n in decoder.graph.node if n.op_type == "Concat" and len(n.input) == forms.ROWS]


@pytest.mark.prepares_models
def test_without_blocked_kernels_only_the_1d_form_is_made(tmp_path, monkeypatch):
    # ARM (a Pi): ONNX Runtime runs a 2-D convolution as the 1-D one; nothing to make or time
    monkeypatch.setattr(forms, "blocked_conv_kernels", lambda: False)
    source = FIXTURE_MODELS / "onnx" / "speakers" / "tiny-voice" / "synthesizer.onnx"
    options = lambda: _session_options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)  # noqa: E731
    parts = split.split_synthesizer(source, tmp_path, options)
    assert list(parts.decoders) == ["1d"]
    assert [p.name for p in parts.folder.glob("decoder*")] == ["decoder.onnx"]
    assert split.cached_split(source, tmp_path).decoders == parts.decoders  # and the stamp says so


def _x86_with_avx2() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    return platform.machine() == "x86_64" and cpuinfo.is_file() and " avx2" in cpuinfo.read_text()


def test_a_failed_kernel_probe_makes_every_form_to_be_timed(monkeypatch, caplog):
    def no_space(**_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(forms.tempfile, "TemporaryDirectory", no_space)
    forms.blocked_conv_kernels.cache_clear()
    try:
        assert forms.blocked_conv_kernels()
    finally:
        forms.blocked_conv_kernels.cache_clear()
    assert "timing every decoder form" in caplog.text


@pytest.mark.skipif(not _x86_with_avx2(), reason="ONNX Runtime has blocked (NCHWc) kernels on x86-64 with AVX2")
def test_onnx_runtime_is_found_to_have_blocked_kernels_on_x86_with_avx2():
    assert forms.blocked_conv_kernels()

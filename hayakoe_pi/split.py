"""Cutting a published synthesizer.onnx into "everything before the decoder" and the decoder.

The HiFi-GAN decoder is convolutional, so it can run over windows of latent
frames (with enough overlap to cover its receptive field) while the flow
before it, which attends over the whole sentence, runs once. The cut is made
once per model file and kept in a cache folder; later loads do not need the `onnx`
package at all.
"""

from __future__ import annotations

import functools
import logging
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .weights import (clear_folder, fold_constants, model_folder, names_read, read_stamp, save_graph, weightless,
                      write_stamp)

log = logging.getLogger("hayakoe_pi.split")

FRONT_NAME = "front.onnx"
# The decoder's forms: as cut; rewritten as a 2-D network, its narrow stages cut
# into rows (decoder_in_rows); and "2d-wide", 2-D only where a convolution reads
# at least WIDE_CHANNELS channels (each rewritten form kept only when it gives
# the same samples, and made only where ONNX Runtime has blocked kernels:
# blocked_conv_kernels). Which is fastest depends on the CPU: prepare times them.
DECODER_FORMS = {"1d": "decoder.onnx", "2d": "decoder-2d.onnx", "2d-wide": "decoder-2d-wide.onnx"}
# ONNX Runtime's blocked 2-D kernels share a convolution's work among threads
# by groups of 4 blocks of output channels (32 with AVX2, 64 with AVX-512) and
# by output rows. A height-1 layer narrower than that runs on one thread: per
# layer (AMD EPYC AVX2, 2 threads), 5-15 % faster than im2col + GEMM from 64
# channels up, 25-40 % slower at 16 and 32, yet faster at every width on one
# thread. "2d-wide" keeps the narrow layers 1-D; "2d" gives them rows instead.
WIDE_CHANNELS = 64
TWO_D_FROM = {"2d": 0, "2d-wide": WIDE_CHANNELS}  # a rewritten form: 2-D from this many channels up
# The "2d" form's stages with fewer channels than this run as ROWS rows that
# overlap by the layers' reach: the work of 2 threads even with AVX-512's
# 64-channel groups (measured, AVX2, full-size voice, 2 threads, 256 frames:
# the decoder 5-8 % faster than 2d-wide, 2 or 4 rows alike).
ROWS_BELOW_CHANNELS = 128
ROWS = 2
HEIGHT_AXIS = "hayakoe_pi_height_axis"  # the 2-D rewrite's Unsqueeze / Squeeze axes (opset 13 on)
SPLIT_VERSION = 3  # 3: "2d" in rows; a voice split before is split (and timed) again
# Weight names of the decoder's first convolution and its speaker conditioning
# in Style-Bert-VITS2 exports (HayaKoe keeps PyTorch's parameter names).
CONV_PRE_SUFFIX = "dec.conv_pre.weight"
COND_SUFFIX = "dec.cond.weight"


@dataclass
class SplitModel:
    folder: Path
    front: Path  # synthesizer inputs → z (decoder input), g (speaker), [durations]
    decoders: dict[str, Path]  # form → z, g → audio
    z_name: str
    g_name: str | None


def cached_split(source: Path, cache_root: Path) -> SplitModel | None:
    folder = model_folder(source, cache_root)
    stamp = read_stamp(folder, source)
    if not stamp or stamp.get("kind") != "split" or stamp.get("split_version") != SPLIT_VERSION:
        return None
    decoders = {form: folder / DECODER_FORMS[form] for form in stamp["forms"]}
    if not ((folder / FRONT_NAME).is_file() and all(p.is_file() for p in decoders.values())):
        return None
    return SplitModel(folder, folder / FRONT_NAME, decoders, stamp["z"], stamp.get("g"))


def _decoder_inputs(model) -> tuple[str, str | None] | None:
    meta = {p.key: p.value for p in model.metadata_props}
    if "decoder_input_z" in meta:
        return meta["decoder_input_z"], meta.get("decoder_input_g")
    z = g = None
    for node in model.graph.node:
        if node.op_type != "Conv" or len(node.input) < 2:
            continue
        if node.input[1].endswith(CONV_PRE_SUFFIX):
            z = node.input[0]
        elif node.input[1].endswith(COND_SUFFIX):
            g = node.input[0]
    return (z, g) if z else None


def _subgraph(model, inputs: list[str], outputs: list[str]):
    """The part of `model` computing `outputs` from `inputs`, or None if it needs anything else."""
    from onnx import TensorProto, helper

    graph = model.graph
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output}
    initializers = {t.name: t for t in graph.initializer}
    keep, used_init, todo, done = set(), set(), list(outputs), set(inputs)
    while todo:
        name = todo.pop()
        if name in done:
            continue
        done.add(name)
        if name in initializers:
            used_init.add(name)
        elif name in producer:
            index = producer[name]
            if index not in keep:
                keep.add(index)
                todo.extend(names_read(graph.node[index]))
        else:
            return None  # a graph input that was not offered
    infos = {v.name: v for v in [*graph.input, *graph.output, *graph.value_info]}

    def info(name):
        # z and g are float [batch, channels, frames]; a cut edge has no declared shape
        return infos.get(name) or helper.make_tensor_value_info(
            name, TensorProto.FLOAT, [f"{name}_b", f"{name}_c", f"{name}_t"])

    sub = helper.make_graph(
        [graph.node[i] for i in sorted(keep)], graph.name,
        [info(n) for n in inputs], [info(n) for n in outputs],
        [initializers[n] for n in initializers if n in used_init],
    )
    # not onnx.checker: it looks for the external weights beside the working directory;
    # ONNX Runtime checks the part when it loads it
    return helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version,
                             producer_name="hayakoe-pi split")


# Ops the decoder may hold for it to run as a 2-D network: convolutions and
# element-wise ops whose other operands are scalars (broadcasting stays right).
_AS_2D_OPS = {"Conv", "ConvTranspose", "LeakyRelu", "Relu", "Tanh", "Add", "Sub", "Mul", "Div",
              "Identity", "Constant"}


def _scalar_operands_only(graph) -> bool:
    sizes = {t.name: math.prod(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    sizes[node.output[0]] = math.prod(attr.t.dims)
                elif attr.name not in ("value_float", "value_int"):
                    return False
    conv_params = {x for n in graph.node if n.op_type in ("Conv", "ConvTranspose") for x in n.input[1:]}
    identity_of = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity"}
    for node in graph.node:
        if node.op_type in ("Conv", "ConvTranspose", "Identity", "Constant"):
            continue
        for x in node.input:
            source = identity_of.get(x, x)
            if source in sizes and x not in conv_params and sizes[source] != 1:
                return False
    return True


def _weight_shapes(graph) -> dict[str, list[int]]:
    """Shapes of the weights, also under the names Identity gives them and the
    2-D rewrite's Unsqueeze (a height axis of 1 after the channels)."""
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:
        if not node.input or node.input[0] not in shapes:
            continue
        dims = shapes[node.input[0]]
        if node.op_type == "Identity":
            shapes[node.output[0]] = dims
        elif node.op_type == "Unsqueeze" and (node.input[1:] == [HEIGHT_AXIS] or
                                              _attributes(node).get("axes") == [2]):
            shapes[node.output[0]] = [*dims[:2], 1, *dims[2:]]
    return shapes


def _input_channels_of_convs(graph) -> dict[int, int]:
    """Channels each 1-D convolution reads (by its node's index), from its weight's shape."""
    shapes = _weight_shapes(graph)
    return {i: shapes[n.input[1]][1] for i, n in enumerate(graph.node)
            if n.op_type == "Conv" and len(shapes.get(n.input[1], ())) == 3}


def decoder_as_2d(decoder, min_channels: int = 0):
    """The decoder as a 2-D network of height 1, or None if its graph does not allow it.

    ONNX Runtime runs 1-D convolutions as im2col + GEMM, but 2-D ones with its
    blocked (NCHWc) direct kernels on x86: same samples to 1e-6, faster or
    slower by the CPU and the layer's width. Inputs get a height axis, every
    (transposed) convolution a height-1 kernel, the output loses the axis
    again. Convolutions reading fewer than `min_channels` channels stay 1-D,
    their input squeezed and their output unsqueezed; with `min_channels` set,
    None also when that leaves all of them 1-D or none (another form's graph).
    """
    from onnx import helper, numpy_helper
    import numpy as np

    graph = decoder.graph
    if any(n.op_type not in _AS_2D_OPS or n.domain not in ("", "ai.onnx") for n in graph.node):
        return None
    if len(graph.output) != 1 or not _scalar_operands_only(graph):
        return None
    channels = _input_channels_of_convs(graph)
    narrow = {conv for conv, c in channels.items() if c < min_channels}
    if min_channels and len(narrow) in (0, sum(n.op_type == "Conv" for n in graph.node)):
        return None
    opset = next((o.version for o in decoder.opset_import if o.domain in ("", "ai.onnx")), 0)
    axes = HEIGHT_AXIS

    def along_height(op, x, y):
        if opset >= 13:
            return helper.make_node(op, [x, axes], [y])
        return helper.make_node(op, [x], [y], axes=[2])

    nodes, renamed = [], {}
    for i in graph.input:
        renamed[i.name] = f"{i.name}__2d"
        nodes.append(along_height("Unsqueeze", i.name, renamed[i.name]))
    out = graph.output[0].name
    for index, node in enumerate(graph.node):
        node.input[:] = [renamed.get(x, x) for x in node.input]
        node.output[:] = [f"{out}__2d" if y == out else y for y in node.output]
        if index in narrow:
            flat_in, flat_out = f"{node.input[0]}__1d_{index}", f"{node.output[0]}__1d"
            nodes.append(along_height("Squeeze", node.input[0], flat_in))
            nodes += [node, along_height("Unsqueeze", flat_out, node.output[0])]
            node.input[0], node.output[0] = flat_in, flat_out
            continue
        if node.op_type in ("Conv", "ConvTranspose"):
            weight = f"{node.input[1]}__2d_{index}"
            nodes.append(along_height("Unsqueeze", node.input[1], weight))
            node.input[1] = weight
            attrs = _attributes(node)
            for key in ("kernel_shape", "strides", "dilations", "output_padding"):
                if key in attrs:
                    attrs[key] = [1 if key != "output_padding" else 0, *attrs[key]]
            if "pads" in attrs:
                begin, end = attrs["pads"]
                attrs["pads"] = [0, begin, 0, end]
            if "output_shape" in attrs:
                attrs["output_shape"] = [1, *attrs["output_shape"]]
            del node.attribute[:]
            node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
        nodes.append(node)
    nodes.append(along_height("Squeeze", f"{out}__2d", out))
    if opset >= 13:
        graph.initializer.append(numpy_helper.from_array(np.array([2], dtype=np.int64), axes))
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    return decoder


def _attributes(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _rows_plan(graph, below_channels: int):
    """Where and how a 2-D decoder's narrow stages can run in rows, or None.

    The cut is the input of the first transposed convolution that gives fewer
    than `below_channels` channels. Everything after it must read only what is
    computed from the cut (or weights and constants), with stride-1
    convolutions and transposed ones that upsample exactly; then a row's
    samples further than the layers' reach from its ends are the sequence's.
    Returns (cut tensor, the nodes after it, margin in samples at the cut,
    upsampling from the cut to the output), the margin at most one latent
    frame (else the rows would cost more than they give).
    """
    constant = {t.name for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" or (node.op_type in ("Unsqueeze", "Identity")
                                          and all(x in constant for x in node.input)):
            constant.update(node.output)  # weights made 2-D
    weights = _weight_shapes(graph)
    cut, upsampled = None, 1
    for node in graph.node:
        if node.op_type == "ConvTranspose":
            dims = weights.get(node.input[1])
            if dims is None:
                return None
            if dims[1] * _attributes(node).get("group", 1) < below_channels:
                cut = node.input[0]
                break
            upsampled *= _attributes(node).get("strides", [1, 1])[-1]
    if cut is None:
        return None
    # per tensor after the cut: its reach back to the cut (samples at the cut) and its upsampling
    reach, scale, after = {cut: 0.0}, {cut: 1}, []
    for node in graph.node:
        inputs = [x for x in node.input if x and x not in constant]
        if not any(x in reach for x in inputs):
            continue
        if not all(x in reach for x in inputs) or len({scale[x] for x in inputs}) != 1:
            return None  # it also reads what came before the cut, or mixes rates
        r, s = max(reach[x] for x in inputs), scale[inputs[0]]
        a = _attributes(node)
        if node.op_type in ("Conv", "ConvTranspose"):
            kernel = weights.get(node.input[1], [])[2:]
            if len(kernel) != 2 or kernel[0] != 1:
                return None
            k, pads, stride = kernel[1], a.get("pads", [0, 0, 0, 0]), a.get("strides", [1, 1])[-1]
        if node.op_type == "Conv":
            if stride != 1:
                return None
            r += max(pads[1], (k - 1) * a.get("dilations", [1, 1])[-1] - pads[1]) / s
        elif node.op_type == "ConvTranspose":
            if "output_shape" in a or k - pads[1] - pads[3] + a.get("output_padding", [0, 0])[-1] != stride:
                return None  # not exactly `stride` samples out per sample in
            r += (max(k - 1 - pads[1], pads[1]) // stride + 1) / s
            s *= stride
        elif node.op_type not in _AS_2D_OPS and node.op_type != "Squeeze":
            return None
        for y in node.output:
            reach[y], scale[y] = r, s
        after.append(node)
    last = after[-1]
    if last.op_type != "Squeeze" or [o.name for o in graph.output] != [last.output[0]]:
        return None
    margin = math.ceil(reach[last.input[0]]) + 1
    return (cut, after, margin, scale[last.input[0]]) if margin <= upsampled else None


def decoder_in_rows(decoder, rows: int, below_channels: int):
    """The 2-D decoder (decoder_as_2d) with its stages under `below_channels`
    channels run as `rows` rows of height, or None (graph left as it was).

    ONNX Runtime's blocked kernels share work among threads by output rows
    and groups of output channels; a height-1 narrow layer has one of each.
    The signal at the cut, L samples, is cut into rows of S = ceil(L / rows)
    samples that each take `margin` more from their neighbours, stacked
    along the height, and every row is computed at once; from row i's
    output only its own S samples are kept. Short inputs get full-length
    rows (each row the whole signal), which stays exact.
    """
    from onnx import helper, numpy_helper
    import numpy as np

    opset = next((o.version for o in decoder.opset_import if o.domain in ("", "ai.onnx")), 0)
    graph = decoder.graph
    plan = _rows_plan(graph, below_channels) if opset >= 15 and rows > 1 else None
    if plan is None:
        return None
    cut, after, margin, up = plan
    p = "hayakoe_pi_rows_"

    def const(name, value):
        graph.initializer.append(numpy_helper.from_array(np.array([value], dtype=np.int64), p + name))
        return p + name

    def op(kind, inputs, output, **attrs):
        return helper.make_node(kind, inputs, [p + output], **attrs)

    zero, one, count, width_axis = const("0", 0), const("1", 1), const("rows", rows), const("w", 3)
    margin_, margin2, up_ = const("margin", margin), const("margin2", 2 * margin), const("up", up)
    rows_axes = p + "axes"
    graph.initializer.append(numpy_helper.from_array(np.array([2, 3], dtype=np.int64), rows_axes))
    L, S, W, room = p + "L", p + "S", p + "W", p + "room"
    cutting = [op("Shape", [cut], "L", start=3, end=4),
               op("Add", [L, count], "L+rows"), op("Sub", [p + "L+rows", one], "L+rows-1"),
               op("Div", [p + "L+rows-1", count], "S"),  # ceil(L / rows)
               op("Add", [S, margin2], "S+2m"), op("Min", [p + "S+2m", L], "W"),
               op("Sub", [L, W], "room")]
    cropping = []
    last = after[-1]
    for i in range(rows):
        q = f"{i}_"
        first, next_ = const(q + "i", i), const(q + "i+1", i + 1)
        cutting += [
            op("Mul", [S, first], q + "iS"), op("Sub", [p + q + "iS", margin_], q + "iS-m"),
            op("Max", [p + q + "iS-m", zero], q + "a0"), op("Min", [p + q + "a0", room], q + "a"),  # row start
            op("Add", [p + q + "a", W], q + "a+W"),
            op("Slice", [cut, p + q + "a", p + q + "a+W", width_axis], q + "row"),
            # the row's own samples, [iS, min((i+1)S, L)), from its start, upsampled to the output
            op("Sub", [p + q + "iS", p + q + "a"], q + "keep0"),
            op("Mul", [S, next_], q + "(i+1)S"), op("Min", [p + q + "(i+1)S", L], q + "end"),
            op("Sub", [p + q + "end", p + q + "a"], q + "keep1"),
            op("Mul", [p + q + "keep0", up_], q + "out0"), op("Mul", [p + q + "keep1", up_], q + "out1"),
            op("Concat", [first, p + q + "out0"], q + "starts", axis=0),
            op("Concat", [next_, p + q + "out1"], q + "ends", axis=0)]
        cropping.append(op("Slice", [last.input[0], p + q + "starts", p + q + "ends", rows_axes], q + "kept"))
    cutting.append(op("Concat", [f"{p}{i}_row" for i in range(rows)], "stacked", axis=2))
    cropping.append(op("Concat", [f"{p}{i}_kept" for i in range(rows)], "joined", axis=3))
    for node in after:
        node.input[:] = [p + "stacked" if x == cut else x for x in node.input]
    last.input[0] = p + "joined"
    nodes = list(graph.node)
    at = next((i + 1 for i, n in enumerate(nodes) if cut in n.output), 0)
    end = next(i for i, n in enumerate(nodes) if n.output == last.output)
    nodes = nodes[:at] + cutting + nodes[at:end] + cropping + nodes[end:]
    del graph.node[:]
    graph.node.extend(nodes)
    return decoder


def _input_channels(graph, name: str) -> int | None:
    """Channels of a decoder input, from the weights of the convolution that reads it
    (a cut edge has no declared shape)."""
    channels = _input_channels_of_convs(graph)
    return next((channels.get(i) for i, n in enumerate(graph.node) if n.op_type == "Conv" and n.input[0] == name),
                None)


def _same_output(one: Path, other: Path, z_name: str, g_name: str | None, session_options,
                 tolerance: float = 1e-5) -> bool:
    """Whether two decoders give the same samples on a random latent (checked once, at split)."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    graph = onnx.load(str(one), load_external_data=False).graph
    feeds = {}
    for name, frames in ((z_name, 20), (g_name, 1)):
        if name:
            channels = _input_channels(graph, name)
            if channels is None:
                return False
            feeds[name] = rng.standard_normal((1, channels, frames), dtype=np.float32)
    runs = [ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])
            .run(None, feeds)[0] for path in (one, other)]
    return runs[0].shape == runs[1].shape and float(np.abs(runs[0] - runs[1]).max()) <= tolerance


def split_synthesizer(source: Path, cache_root: Path, session_options) -> SplitModel | None:
    """The cached split of `source`, making it first if needed; None if it cannot be split.

    The parts are graphs whose weights are in the model folder's weight files
    (weights.py): the model is never held in memory whole. session_options()
    gives the options for the sessions that fold constants and check the 2-D
    decoder (they must match the process's ONNX Runtime set-up).
    """
    found = cached_split(source, cache_root)
    if found:
        return found
    try:
        import onnx  # noqa: F401
    except ImportError:
        log.warning("the onnx package is missing: decoding %s in one piece", source)
        return None
    folder = model_folder(source, cache_root)
    clear_folder(folder)
    model = weightless(source, folder)
    names = _decoder_inputs(model)
    if names is None:
        log.warning("no HiFi-GAN decoder found in %s: decoding in one piece", source)
        return None
    z, g = names
    fold_constants(model, folder, session_options)
    outputs = [o.name for o in model.graph.output]
    dec_inputs = [z] + ([g] if g else [])
    try:
        front = _subgraph(model, [i.name for i in model.graph.input], dec_inputs + outputs[1:])
        decoder = _subgraph(model, dec_inputs, outputs[:1])
    except Exception as e:
        log.warning("cannot split %s (%s): decoding in one piece", source, e)
        return None
    if front is None or decoder is None:
        log.warning("the decoder of %s needs more than z and g: decoding in one piece", source)
        return None
    save_graph(front, folder / FRONT_NAME)
    save_graph(decoder, folder / DECODER_FORMS["1d"])
    forms = ["1d"]
    if blocked_conv_kernels():
        forms += [form for form in TWO_D_FROM if _save_2d_form(decoder, form, folder, z, g, source, session_options)]
    else:
        log.info("decoder of %s: no 2-D forms (ONNX Runtime has no blocked convolution kernels on "
                 "this CPU: they would compute as the 1-D one)", source)
    # last: see weights.py
    write_stamp(folder, source, kind="split", z=z, g=g, forms=forms, split_version=SPLIT_VERSION)
    log.info("split %s into its decoder and the rest (%s)", source.name, folder)
    return cached_split(source, cache_root)


@functools.cache
def blocked_conv_kernels() -> bool:
    """Whether ONNX Runtime runs 2-D convolutions with its blocked (NCHWc) kernels here.

    Only then can a 2-D form of the decoder be faster or slower than the 1-D
    one (x86-64 with AVX2 or AVX-512). Elsewhere (ARM: a Raspberry Pi) both run
    im2col + GEMM, and making, optimizing and timing the 2-D forms would only
    cost the first start time, memory and SD card writes. ONNX Runtime is asked
    itself: it optimizes a one-convolution graph, and its NCHWc nodes are looked for.
    """
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    # 64 channels: a multiple of every block size (8 floats with AVX2, 16 with AVX-512)
    shape = [1, 64, 1, 16]
    weight = numpy_helper.from_array(np.zeros((64, 64, 1, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[0, 1, 0, 1])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    try:
        with tempfile.TemporaryDirectory(prefix="hayakoe-pi-probe-") as folder:
            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            opts.optimized_model_filepath = str(Path(folder) / "probe.onnx")
            opts.log_severity_level = 3  # its warning about saving CPU-specific kernels is the point here
            ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            optimized = onnx.load(opts.optimized_model_filepath)
    except Exception as e:  # no temporary folder, say: make the forms and let the timing choose
        log.warning("cannot ask ONNX Runtime for its convolution kernels (%s): timing every decoder form", e)
        return True
    return any(node.domain == "com.microsoft.nchwc" for node in optimized.graph.node)


def _save_2d_form(decoder, form: str, folder: Path, z: str, g: str | None, source: Path, session_options) -> bool:
    """Save a rewritten form of the decoder if it gives the same samples as the one cut."""
    import onnx

    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(decoder)
    path = folder / DECODER_FORMS[form]
    try:
        rewritten = decoder_as_2d(rewritten, TWO_D_FROM[form])
        if rewritten is None:
            return False  # not rewritable, or the same graph as another form
        if form == "2d":
            rewritten = decoder_in_rows(rewritten, ROWS, ROWS_BELOW_CHANNELS) or rewritten
        save_graph(rewritten, path)
        if _same_output(folder / DECODER_FORMS["1d"], path, z, g, session_options):
            return True
    except Exception as e:  # an op or attribute this rewrite does not know
        log.warning("decoder of %s: no %s form (%s)", source, form, e)
    else:
        log.info("decoder of %s: no %s form (other samples)", source, form)
    path.unlink(missing_ok=True)
    return False


def decoder_margin(model_config: dict) -> int:
    """Latent frames each side of a window that can affect its samples (HiFi-GAN's reach).

    Each layer's reach, in samples at its own resolution, converted to frames
    and summed: conv_pre (kernel 7), per stage the transposed convolution
    (kernel k, stride u: k/2u input steps) and the widest residual block
    (dilated convolutions, each followed by a plain one in ResBlock1), then
    conv_post. For HiFi-GAN v1 (JP-Extra) that is 14 frames; windows decoded
    with it equal one pass to float rounding.
    """
    m = model_config
    rates = m.get("upsample_rates", [8, 8, 2, 2, 2])
    kernels = m.get("upsample_kernel_sizes", [16, 16, 8, 2, 2])
    rb_kernels = m.get("resblock_kernel_sizes", [3, 7, 11])
    rb_dilations = m.get("resblock_dilation_sizes", [[1, 3, 5]] * 3)
    plain_after_each = m.get("resblock", "1") == "1"
    frames = 3.0  # conv_pre, kernel 7
    scale = 1
    for rate, kernel in zip(rates, kernels):
        frames += kernel / rate / 2 / scale
        scale *= rate
        reach = max(sum((k - 1) / 2 * (d + (1 if plain_after_each else 0)) for d in dilations)
                    for k, dilations in zip(rb_kernels, rb_dilations))
        frames += reach / scale
    frames += 3 / scale  # conv_post, kernel 7
    return math.ceil(frames)

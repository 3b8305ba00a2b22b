"""The decoder's forms: as cut (1-D), and rewritten as a 2-D network of height 1,
whole or only where it is wide; and whether ONNX Runtime has the blocked kernels
that can make a 2-D form faster on this CPU at all. Its narrow stages in rows: rows.py.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import tempfile
from pathlib import Path

from .graphs import HEIGHT_AXIS, attributes, conv_input_channels

log = logging.getLogger("hayakoe_pi.split")

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

# Ops the decoder may hold for it to run as a 2-D network: convolutions and
# element-wise ops whose other operands are scalars (broadcasting stays right).
AS_2D_OPS = {"Conv", "ConvTranspose", "LeakyRelu", "Relu", "Tanh", "Add", "Sub", "Mul", "Div",
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
    if any(n.op_type not in AS_2D_OPS or n.domain not in ("", "ai.onnx") for n in graph.node):
        return None
    if len(graph.output) != 1 or not _scalar_operands_only(graph):
        return None
    channels = conv_input_channels(graph)
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
            attrs = attributes(node)
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


@functools.cache
def blocked_conv_kernels() -> bool:
    """Whether ONNX Runtime runs 2-D convolutions with its blocked (NCHWc) kernels here.

    Only then can a 2-D form of the decoder be faster or slower than the 1-D
    one (x86-64 with AVX2 or AVX-512). Elsewhere (ARM: a Raspberry Pi) both run
    im2col + GEMM, and making, optimizing and timing the 2-D forms would only
    cost the first start time, memory and SD card writes. ONNX Runtime is asked
    itself: it optimizes a one-convolution graph, and its NCHWc nodes are looked for.
    HAYAKOE_PI_ARM_PATH=1 answers no, as a Pi would (bench/run.py --arm-path).
    """
    if os.environ.get("HAYAKOE_PI_ARM_PATH") == "1":
        return False
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

"""The 2-D decoder's narrow stages run as rows of height: the work of several threads
where ONNX Runtime's blocked kernels would give a height-1 narrow layer one."""

from __future__ import annotations

import math

from .forms import AS_2D_OPS
from .graphs import attributes, weight_shapes


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
    weights = weight_shapes(graph)
    cut, upsampled = None, 1
    for node in graph.node:
        if node.op_type == "ConvTranspose":
            dims = weights.get(node.input[1])
            if dims is None:
                return None
            if dims[1] * attributes(node).get("group", 1) < below_channels:
                cut = node.input[0]
                break
            upsampled *= attributes(node).get("strides", [1, 1])[-1]
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
        a = attributes(node)
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
        elif node.op_type not in AS_2D_OPS and node.op_type != "Squeeze":
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

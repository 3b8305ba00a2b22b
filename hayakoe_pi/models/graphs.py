"""Reading ONNX graphs: what a node reads, its attributes, the weights' shapes and the
channels a convolution reads (split, forms, rows, tune and unsigned share these)."""

from __future__ import annotations

HEIGHT_AXIS = "hayakoe_pi_height_axis"  # the 2-D rewrite's Unsqueeze / Squeeze axes (opset 13 on)


def names_read(node) -> set[str]:
    """Tensors a node reads, including those its subgraphs (If, Loop) take from outside."""
    names = set(node.input)
    for attr in node.attribute:
        graphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
        for graph in graphs:
            inner = {o for n in graph.node for o in n.output}
            inner |= {i.name for i in graph.input} | {i.name for i in graph.initializer}
            for n in graph.node:
                names |= names_read(n) - inner
    names.discard("")
    return names


def attributes(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def weight_shapes(graph) -> dict[str, list[int]]:
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
                                              attributes(node).get("axes") == [2]):
            shapes[node.output[0]] = [*dims[:2], 1, *dims[2:]]
    return shapes


def conv_input_channels(graph) -> dict[int, int]:
    """Channels each 1-D convolution reads (by its node's index), from its weight's shape."""
    shapes = weight_shapes(graph)
    return {i: shapes[n.input[1]][1] for i, n in enumerate(graph.node)
            if n.op_type == "Conv" and len(shapes.get(n.input[1], ())) == 3}


def input_channels(graph, name: str) -> int | None:
    """Channels of a decoder input, from the weights of the convolution that reads it
    (a cut edge has no declared shape)."""
    channels = conv_input_channels(graph)
    return next((channels.get(i) for i, n in enumerate(graph.node) if n.op_type == "Conv" and n.input[0] == name),
                None)

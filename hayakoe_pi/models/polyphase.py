"""The decoder's transposed convolutions rewritten as plain convolutions, for an 8-bit
decoder: ONNX Runtime has 8-bit convolutions on the CPU but no 8-bit transposed
convolution (a quantized ConvTranspose runs in FP32 between a DequantizeLinear and a
QuantizeLinear), and the five upsamplers take a sixth of the 8-bit decoder's time.
quantize_decoder(upsamplers=True) uses it; prepare does not: 2 % fewer instructions for
10-12 dB less SNR (bench/README.md).

A transposed convolution of stride s and kernel k (a multiple of s) is s convolutions of
kernel k/s, one a phase of the output, interleaved. Here they are one convolution with s
times the output channels, then Reshape, Transpose and Reshape interleave the phases, and
a Slice drops the padding. Same multiply-adds, same samples in FP32 (to rounding)."""

from __future__ import annotations

import numpy as np

from .graphs import attributes


def _rewritable(node, weights: dict) -> bool:
    attrs = attributes(node)
    if node.op_type != "ConvTranspose" or node.input[1] not in weights or len(weights[node.input[1]].shape) != 3:
        return False
    if len(node.input) > 2 and node.input[2] and node.input[2] not in weights:
        return False
    kernel, stride = weights[node.input[1]].shape[2], attrs.get("strides", [1])[0]
    return (attrs.get("group", 1) == 1 and attrs.get("dilations", [1]) == [1] and kernel % stride == 0
            and attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET") and "output_shape" not in attrs
            and not any(attrs.get("output_padding", [0])))


def as_convolutions(model) -> int:
    """Rewrite `model`'s 1-D transposed convolutions (weights given, no groups or dilation)
    in place as convolutions with their phases interleaved; how many were rewritten."""
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    nodes, constants, count = [], [], 0
    for node in graph.node:
        if not _rewritable(node, weights):
            nodes.append(node)
            continue
        w = weights[node.input[1]]  # [in, out, kernel]
        channels_in, channels_out, kernel = w.shape
        attrs = attributes(node)
        stride = attrs["strides"][0]
        taps = kernel // stride
        begin, end = attrs.get("pads", [0, 0])
        # phase r's tap i is the kernel's r + i·s, read i frames back: a convolution's
        # kernel reversed; output channel o·s + r
        phases = w.reshape(channels_in, channels_out, taps, stride).transpose(1, 3, 0, 2)[..., ::-1]
        name = f"{node.name or node.output[0]}__phases"
        conv_inputs = [node.input[0], f"{name}_w"]
        constants.append(numpy_helper.from_array(
            np.ascontiguousarray(phases.reshape(channels_out * stride, channels_in, taps)), conv_inputs[1]))
        if len(node.input) > 2 and node.input[2]:
            conv_inputs.append(f"{name}_b")
            constants.append(numpy_helper.from_array(np.repeat(weights[node.input[2]], stride), conv_inputs[2]))
        constants += [numpy_helper.from_array(np.array(v, np.int64), f"{name}_{key}") for key, v in (
            ("split", [0, channels_out, stride, -1]), ("merge", [0, channels_out, -1]),
            ("begin", [begin]), ("end", [-end if end else np.iinfo(np.int64).max]), ("axis", [2]))]
        nodes += [
            helper.make_node("Conv", conv_inputs, [f"{name}_y"], name=name, kernel_shape=[taps],
                             pads=[taps - 1, taps - 1]),
            helper.make_node("Reshape", [f"{name}_y", f"{name}_split"], [f"{name}_split_y"]),
            helper.make_node("Transpose", [f"{name}_split_y"], [f"{name}_t"], perm=[0, 1, 3, 2]),
            helper.make_node("Reshape", [f"{name}_t", f"{name}_merge"], [f"{name}_full"]),
            helper.make_node("Slice", [f"{name}_full", f"{name}_begin", f"{name}_end", f"{name}_axis"],
                             list(node.output)),
        ]
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    read = {x for n in nodes for x in n.input}
    kept = [t for t in graph.initializer if t.name in read or t.name in {i.name for i in graph.input}]
    del graph.initializer[:]
    graph.initializer.extend(kept + constants)  # the transposed convolutions' weights dropped
    return count

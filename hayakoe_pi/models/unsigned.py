"""BERT's 8-bit products: whether this CPU computes uint8 × int8 exactly, and where it
does not, the int8 weights of the integer matrix products made uint8 (the same products)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..durable import fsync
from .graphs import names_read
from .sessions import prepare_options


def signed_int8_products_exact() -> bool:
    """Whether ONNX Runtime multiplies uint8 by int8 exactly on this CPU.

    x86 without VNNI adds pairs of such products in 16 bits, saturating
    (255 × -128 twice is -65,280): the Q8 BERT is then made unsigned
    (unsigned_integer_weights). Tried, not inferred from CPU flags,
    with the options of the BERT session.
    """
    from onnx import TensorProto, helper, numpy_helper

    depth = 64
    a = np.full((4, depth), 255, dtype=np.uint8)
    b = np.full((depth, 16), -128, dtype=np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape)],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)], [numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(),
                                   prepare_options(),
                                   providers=["CPUExecutionProvider"])
    return bool((session.run(None, {"a": a})[0] == 255 * -128 * depth).all())


# Integer matrix products with 8-bit weights: the op (domain, type) → where its weight
# and the weight's zero point are among its inputs
_INTEGER_PRODUCTS = {("", "MatMulInteger"): (1, 3), ("com.microsoft", "DynamicQuantizeMatMul"): (1, 3)}
_INT8, _UINT8 = 3, 2  # TensorProto.DataType
_FLIP_CHUNK = 1 << 24


def _product_inputs(node) -> tuple[int, int] | None:
    """Where an integer matrix product reads its weight and that weight's zero point."""
    return _INTEGER_PRODUCTS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))


def _flip_sign_bits(path: Path, at: int, length: int) -> None:
    """Add 128 to each int8 at path[at:at + length], making it the uint8 of the same order
    (x + 128 is x with its top bit flipped), in pieces: never the whole tensor in memory."""
    fd = os.open(path, os.O_RDWR)
    try:
        for start in range(at, at + length, _FLIP_CHUNK):
            piece = np.frombuffer(os.pread(fd, min(_FLIP_CHUNK, at + length - start), start), dtype=np.uint8)
            os.pwrite(fd, (piece ^ 0x80).tobytes(), start)
    finally:
        os.close(fd)


def unsigned_integer_weights(model, folder: Path) -> int:
    """Make the int8 weights of the model's integer matrix products uint8, each value and
    its zero point + 128: (w + 128) - (z + 128) = w - z, so every product is the same.

    On an x86 CPU without VNNI, ONNX Runtime multiplies uint8 by int8 with an
    instruction that saturates pairs of products at 16 bits, and the Q8 BERT's
    features then differ from the exact ones by up to 1.07 on the test models
    (an arm64 Pi, or x86 with VNNI, computes them exactly); uint8 by uint8 it
    computes exactly everywhere. Tensors in `folder` are changed in place,
    small ones in the graph. Weights and zero points that share a product are
    changed together or not at all, and not at all if anything else reads one.
    Returns how many weights were changed. `model` is an onnx.ModelProto
    loaded without its external data."""
    from onnx import numpy_helper

    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    roles: dict[str, set] = {}  # tensor → how each reader reads it: "weight", "zero" or None (otherwise)
    products = []  # (node, its weight, its zero point or "")
    for node in graph.node:
        positions = _product_inputs(node)
        for i, name in enumerate(node.input):
            roles.setdefault(name, set()).add(positions and {positions[0]: "weight", positions[1]: "zero"}.get(i))
        for name in names_read(node) - set(node.input):  # read inside a subgraph
            roles.setdefault(name, set()).add(None)
        if positions:
            zero = node.input[positions[1]] if len(node.input) > positions[1] else ""
            products.append((node, node.input[positions[0]], zero))
    for output in graph.output:
        roles.setdefault(output.name, set()).add(None)

    group = {}  # weights and zero points joined by the products they meet in

    def root(name: str) -> str:
        while group.setdefault(name, name) != name:
            name = group[name]
        return name

    for _, weight, zero in products:
        joined = root(weight)
        if zero:
            group[root(zero)] = joined
    members: dict[str, list[str]] = {}
    for name in group:
        members.setdefault(root(name), []).append(name)
    convertible = set()
    for names in members.values():
        if all(name in initializers and initializers[name].data_type == _INT8 and None not in roles[name]
               and len(roles[name]) == 1 for name in names):
            convertible.update(names)

    unsigned_zero = "unsigned_integer_weights.zero_point"  # a product without one had zero
    weights = set()
    for node, weight, zero in products:
        if weight not in convertible:
            continue
        weights.add(weight)
        if not zero:
            if unsigned_zero not in initializers:
                initializers[unsigned_zero] = numpy_helper.from_array(np.array(128, dtype=np.uint8), unsigned_zero)
                graph.initializer.append(initializers[unsigned_zero])
            zero_at = _product_inputs(node)[1]
            while len(node.input) < zero_at:
                node.input.append("")
            node.input.append(unsigned_zero)
    locations = set()
    for name in convertible:
        tensor = initializers[name]
        if tensor.data_location == tensor.EXTERNAL:
            place = {e.key: e.value for e in tensor.external_data}
            _flip_sign_bits(folder / place["location"], int(place.get("offset", 0)), int(place["length"]))
            tensor.data_type = _UINT8
            locations.add(place["location"])
        else:
            value = numpy_helper.to_array(tensor).astype(np.int16) + 128
            tensor.CopyFrom(numpy_helper.from_array(value.astype(np.uint8), name))
    for location in locations:
        fsync(folder / location)  # before the stamp that makes the folder trusted
    return len(weights)

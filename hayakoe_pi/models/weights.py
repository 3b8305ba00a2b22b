"""A model's graph apart from its weights, so that preparing it never holds them in memory,
and its constants folded once.

Loading a whole ONNX model into the `onnx` package, or into ONNX Runtime to
optimize it, holds its weights at least twice (the file's bytes, then the
tensors made from them): 1.3 GB for the 490 MB BERT. Here the graph is
parsed alone (wire.py) and its tensors become "external data" in a file of
their own, copied there by the kernel at page-aligned offsets, which ONNX
Runtime maps instead of reading.

The weights file is a second copy of the model's tensors while a model is
prepared; once its optimized copy exists it is dropped (`drop_weights`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..durable import fsync
from .wire import INLINE_TYPES, MIN_EXTERNAL_BYTES, NotRewritable, graph_without_weights

WEIGHTS_NAME = "weights"  # the model's own tensors
FOLDED_NAME = "folded.weights"  # tensors computed once from them
ALIGN = 1 << 16  # offsets ONNX Runtime can map (a multiple of every page size, 64 KiB pages too)


class UnreadableModel(ValueError):
    """The file is not a readable ONNX model (truncated, corrupted)."""


def _copy_range(src: int, dst: int, at: int, length: int, to: int) -> None:
    """Copy bytes file to file in the kernel: they never pass through (or stay in) this process."""
    done = 0
    try:
        while done < length:
            n = os.copy_file_range(src, dst, length - done, at + done, to + done)
            if n == 0:
                raise NotRewritable("the model file is shorter than its tensors")
            done += n
    except OSError:  # no copy_file_range here (old kernel, other file systems): in pieces
        while done < length:
            piece = os.pread(src, min(1 << 20, length - done), at + done)
            if not piece:
                raise NotRewritable("the model file is shorter than its tensors") from None
            os.pwrite(dst, piece, to + done)
            done += len(piece)


def copy_weights(source: Path, folder: Path):
    """The graph of `source` (an onnx.ModelProto) reading its tensors from folder/WEIGHTS_NAME,
    where each large one is copied to a page-aligned offset: ONNX Runtime then maps them
    from the file instead of reading them into memory."""
    import onnx

    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    src = os.open(source, os.O_RDONLY)
    try:
        with open(folder / WEIGHTS_NAME, "wb") as out:
            end = 0

            def place(at: int, length: int) -> tuple[str, int]:
                nonlocal end
                to = -(-end // ALIGN) * ALIGN if length >= ALIGN else end
                _copy_range(src, out.fileno(), at, length, to)
                end = to + length
                return WEIGHTS_NAME, to

            graph = graph_without_weights(source, place)
            os.fsync(out.fileno())
    finally:
        os.close(src)
    return onnx.load_model_from_string(graph)


def weightless(source: Path, folder: Path):
    """`source`'s graph with its tensors in folder/WEIGHTS_NAME (see copy_weights).

    A model this rewrite does not understand (one keeping its weights in
    files of its own already) is loaded whole by the `onnx` package instead,
    holding it in memory once.
    """
    import onnx

    try:
        return copy_weights(source, folder)
    except NotRewritable:
        pass
    try:
        model = onnx.load(str(source))
    except Exception as e:  # protobuf's DecodeError and friends
        raise UnreadableModel(str(e) or type(e).__name__) from None
    onnx.save_model(model, str(folder / "whole.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=WEIGHTS_NAME, size_threshold=MIN_EXTERNAL_BYTES)
    del model
    fsync(folder / WEIGHTS_NAME)
    model = onnx.load(str(folder / "whole.onnx"), load_external_data=False)
    (folder / "whole.onnx").unlink()
    return model


# Ops never evaluated ahead: random, or with subgraphs
_NOT_FOLDED = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
               "Multinomial", "Bernoulli", "If", "Loop", "Scan", "SequenceMap"}


def fold_constants(model, folder: Path, session_options) -> None:
    """Compute once what depends only on weights, as ONNX Runtime's constant folding would,
    but holding only those weights and results (ORT's own pass held the whole 490 MB BERT
    in memory, 830 MB at its peak; this, 250 MB). The results go to folder/FOLDED_NAME;
    `model` (whose tensors live in `folder`) is changed in place."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    graph = model.graph
    constant = {t.name for t in graph.initializer}
    folded = []
    for node in graph.node:
        if node.op_type == "Constant":
            constant.update(node.output)
        elif (node.input and node.domain in ("", "ai.onnx") and node.op_type not in _NOT_FOLDED
              and all(not x or x in constant for x in node.input)):
            folded.append(node)
            constant.update(y for y in node.output if y)
    made = {y for node in folded for y in node.output}
    skip = {id(node) for node in folded}
    wanted = {x for node in graph.node if id(node) not in skip for x in node.input} \
        | {o.name for o in graph.output}
    results = sorted(made & wanted)
    if not results:
        return
    # a model of the folded nodes alone, whose outputs are the results
    need, nodes = set(results), []
    for node in reversed([n for n in graph.node if id(n) in skip or n.op_type == "Constant"]):
        if any(y in need for y in node.output):
            nodes.append(node)
            need.update(x for x in node.input if x)
    part = helper.make_model(
        helper.make_graph(nodes[::-1], "folded", [], [], [t for t in graph.initializer if t.name in need]),
        opset_imports=model.opset_import, ir_version=model.ir_version)
    typed = {v.name: v for v in onnx.shape_inference.infer_shapes(part).graph.value_info}
    if any(name not in typed for name in results):
        return  # a type shape inference cannot give: ONNX Runtime folds it later instead
    part.graph.output.extend(typed[name] for name in results)
    part_path = folder / "folding.onnx"
    part_path.write_bytes(part.SerializeToString())
    try:
        session = ort.InferenceSession(str(part_path), session_options(), providers=["CPUExecutionProvider"])
        values = session.run(results, {})
        del session
    finally:
        part_path.unlink()
    if any(value.dtype == object for value in values):
        return  # strings: left to ONNX Runtime
    tensors = []
    with open(folder / FOLDED_NAME, "wb") as out:
        for name, value in zip(results, values):
            value = np.ascontiguousarray(value)
            data_type = helper.np_dtype_to_tensor_dtype(value.dtype)
            if value.nbytes < MIN_EXTERNAL_BYTES or data_type in INLINE_TYPES:
                tensors.append(numpy_helper.from_array(value, name))
                continue
            tensor = onnx.TensorProto(name=name, dims=value.shape, data_type=data_type)
            at = -(-out.tell() // ALIGN) * ALIGN if value.nbytes >= ALIGN else out.tell()
            out.seek(at)
            out.write(value.data)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, val in (("location", FOLDED_NAME), ("offset", str(at)), ("length", str(value.nbytes))):
                tensor.external_data.add(key=key, value=val)
            tensors.append(tensor)
        os.fsync(out.fileno())
    del values
    kept = [node for node in graph.node if id(node) not in skip]
    used = {x for node in kept for x in node.input} | {o.name for o in graph.output}
    initializers = [t for t in graph.initializer if t.name in used] + tensors
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    unused_constants = [n for n in graph.node if n.op_type == "Constant" and not set(n.output) & used]
    for node in unused_constants:
        graph.node.remove(node)


def drop_weights(folder: Path) -> None:
    """Remove the weight files of a folder once nothing needs them (their optimized copies exist)."""
    for name in (WEIGHTS_NAME, FOLDED_NAME):
        (folder / name).unlink(missing_ok=True)


def has_weights(folder: Path) -> bool:
    return (folder / WEIGHTS_NAME).is_file()

"""A model's graph apart from its weights, so that preparing it never holds them in memory.

Loading a whole ONNX model into the `onnx` package, or into ONNX Runtime to
optimize it, holds its weights at least twice (the file's bytes, then the
tensors made from them): 1.3 GB for the 490 MB BERT. Here the graph is
parsed alone and its tensors become "external data" in a file of their own,
copied there by the kernel at page-aligned offsets, which ONNX Runtime maps
instead of reading. The rewrite works on the protobuf wire format over a
memory map, so the weights never pass through Python: each initializer's
`raw_data` field is replaced by its place in the new file.

The weights file is a second copy of the model's tensors while a model is
prepared; once its optimized copy exists it is dropped (`drop_weights`).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
from pathlib import Path

import numpy as np

WEIGHTS_NAME = "weights"  # the model's own tensors
FOLDED_NAME = "folded.weights"  # tensors computed once from them
MIN_EXTERNAL_BYTES = 1024  # smaller tensors stay in the graph
# int64 tensors are shapes, pads, axes: shape inference must read them, and it
# cannot read external data. They stay in the graph (they are small).
INLINE_TYPES = {7}  # TensorProto.INT64
ALIGN = 1 << 16  # offsets ONNX Runtime can map (a multiple of every page size, 64 KiB pages too)

# Field numbers from onnx.proto3
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_DIMS = 1
_TENSOR_DATA_TYPE = 2
_TENSOR_NAME = 8
_TENSOR_RAW_DATA = 9
_TENSOR_EXTERNAL_DATA = 13
_TENSOR_DATA_LOCATION = 14
_EXTERNAL = 1


class NotRewritable(ValueError):
    """The file is not a single-file ONNX model this rewrite understands."""


def _varint(buf, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise NotRewritable("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise NotRewritable("varint too long")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(buf, start: int, end: int):
    """(field number, wire type, first byte of the field, first byte of its value, end) in buf[start:end]."""
    pos = start
    while pos < end:
        begin = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value_at = pos
            _, pos = _varint(buf, pos)
        elif wire == 1:
            value_at, pos = pos, pos + 8
        elif wire == 2:
            length, value_at = _varint(buf, pos)
            pos = value_at + length
        elif wire == 5:
            value_at, pos = pos, pos + 4
        else:
            raise NotRewritable(f"unsupported wire type {wire}")
        if pos > end:
            raise NotRewritable("field runs past its message")
        yield number, wire, begin, value_at, pos


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _entry(key: str, value: str) -> bytes:
    return _length_delimited(_TENSOR_EXTERNAL_DATA,
                             _length_delimited(1, key.encode()) + _length_delimited(2, value.encode()))


def _tensor(buf, start: int, end: int, place) -> bytes:
    fields = list(_fields(buf, start, end))
    data_type = next((_varint(buf, at)[0] for number, wire, _, at, _ in fields
                      if number == _TENSOR_DATA_TYPE and wire == 0), 0)
    out = bytearray()
    raw = None
    for number, wire, begin, value_at, stop in fields:
        if number == _TENSOR_EXTERNAL_DATA or (
                number == _TENSOR_DATA_LOCATION and _varint(buf, value_at)[0] == _EXTERNAL):
            raise NotRewritable("the model keeps its weights in other files already")
        if number == _TENSOR_DATA_LOCATION:
            continue  # DEFAULT, said explicitly; set again below where the data moves out
        if (number == _TENSOR_RAW_DATA and wire == 2 and stop - value_at >= MIN_EXTERNAL_BYTES
                and data_type not in INLINE_TYPES):
            raw = (value_at, stop - value_at)
        else:
            out += buf[begin:stop]
    if raw is None:
        return bytes(out)
    location, offset = place(*raw)
    out += _entry("location", location) + _entry("offset", str(offset)) + _entry("length", str(raw[1]))
    out += _encode_varint(_TENSOR_DATA_LOCATION << 3) + _encode_varint(_EXTERNAL)
    return bytes(out)


def _graph(buf, start: int, end: int, place) -> bytes:
    out = bytearray()
    for number, wire, begin, value_at, stop in _fields(buf, start, end):
        if number == _GRAPH_INITIALIZER and wire == 2:
            out += _length_delimited(number, _tensor(buf, value_at, stop, place))
        else:
            out += buf[begin:stop]
    return bytes(out)


def graph_without_weights(source: Path, place) -> bytes:
    """The serialized ModelProto of `source` with each large initializer's data replaced by
    external data at `place(offset in source, length)` → (location, offset)."""
    with open(source, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise NotRewritable("empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if hasattr(buf, "madvise"):
                buf.madvise(mmap.MADV_RANDOM)  # only the headers between tensors are read
            out, graphs = bytearray(), 0
            for number, wire, begin, value_at, stop in _fields(buf, 0, size):
                if number == _MODEL_GRAPH and wire == 2:
                    out += _length_delimited(number, _graph(buf, value_at, stop, place))
                    graphs += 1
                else:
                    out += buf[begin:stop]
    if graphs != 1:
        raise NotRewritable("no graph")
    return bytes(out)


# TensorProto.DataType → numpy, for the tensors shared_weights maps
_NUMPY_TYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64,
                10: np.float16, 11: np.float64}


def _ints(buf, wire: int, value_at: int, stop: int) -> list[int]:
    """A repeated int64 field's values (packed or one)."""
    if wire == 0:
        return [_varint(buf, value_at)[0]]
    values, pos = [], value_at
    while pos < stop:
        value, pos = _varint(buf, pos)
        values.append(value)
    return values


def shared_weights(graph: Path) -> dict[str, np.ndarray]:
    """The external tensors of the saved graph `graph` as read-only arrays over one
    memory map of their files: sessions given them (SessionOptions.add_initializer)
    all read the same pages instead of mapping the files once each."""
    buf = graph.read_bytes()
    maps: dict[str, np.ndarray] = {}
    tensors = {}
    for number, wire, _, value_at, stop in _fields(buf, 0, len(buf)):
        if number != _MODEL_GRAPH or wire != 2:
            continue
        for n, w, _, at, end in _fields(buf, value_at, stop):
            if n != _GRAPH_INITIALIZER or w != 2:
                continue
            name, dims, data_type, place = None, [], 0, {}
            for f, fw, _, fat, fend in _fields(buf, at, end):
                if f == _TENSOR_NAME and fw == 2:
                    name = bytes(buf[fat:fend]).decode()
                elif f == _TENSOR_DIMS:
                    dims += _ints(buf, fw, fat, fend)
                elif f == _TENSOR_DATA_TYPE and fw == 0:
                    data_type = _varint(buf, fat)[0]
                elif f == _TENSOR_EXTERNAL_DATA and fw == 2:
                    entry = {k: bytes(buf[kat:kend]).decode() for k, _, _, kat, kend in _fields(buf, fat, fend)}
                    place[entry.get(1)] = entry.get(2)
            if name and data_type in _NUMPY_TYPES and {"location", "offset", "length"} <= set(place):
                location = graph.parent / place["location"]
                if location.parent != graph.parent:
                    continue  # only files beside the graph
                if place["location"] not in maps:
                    maps[place["location"]] = np.memmap(location, dtype=np.uint8, mode="r")
                start, length = int(place["offset"]), int(place["length"])
                tensors[name] = (maps[place["location"]][start:start + length]
                                 .view(_NUMPY_TYPES[data_type]).reshape(dims))
    return tensors


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


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


def durable_replace(tmp: Path, target: Path) -> None:
    """Rename `tmp` to `target` only once its bytes are on disk: after a power cut
    there is either no `target` or a whole one."""
    _fsync(tmp)
    tmp.replace(target)
    _fsync_dir(target.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # a file system without directory fsync
        pass


def save_graph(model, path: Path) -> None:
    """Write a graph whose tensors are external (small), durably."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(model.SerializeToString())
    durable_replace(tmp, path)


def drop_weights(folder: Path) -> None:
    """Remove the weight files of a folder once nothing needs them (their optimized copies exist)."""
    for name in (WEIGHTS_NAME, FOLDED_NAME):
        (folder / name).unlink(missing_ok=True)


def has_weights(folder: Path) -> bool:
    return (folder / WEIGHTS_NAME).is_file()


STAMP_NAME = "prepared.json"  # written last: a folder without a valid one is made again


def model_folder(source: Path, cache_root: Path) -> Path:
    """Where what is derived from `source` is kept. Never beside the model: model
    folders may be read-only or shared."""
    return cache_root / hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]


def _source_stamp(source: Path) -> dict:
    st = source.stat()
    return {"source": str(source.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "version": 3}


def read_stamp(folder: Path, source: Path) -> dict | None:
    """The folder's stamp if it was made, whole, from `source` as it is now."""
    try:
        stamp = json.loads((folder / STAMP_NAME).read_text())
        want = _source_stamp(source)
    except (OSError, ValueError):
        return None
    return stamp if {k: stamp.get(k) for k in want} == want else None


def write_stamp(folder: Path, source: Path, **facts) -> None:
    tmp = folder / f"{STAMP_NAME}.tmp"
    tmp.write_text(json.dumps({**_source_stamp(source), **facts}))
    durable_replace(tmp, folder / STAMP_NAME)


def clear_folder(folder: Path) -> None:
    """Start a folder again; its stamp goes first, so a half-removed folder is never trusted."""
    (folder / STAMP_NAME).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, mode=0o700)


class UnreadableModel(ValueError):
    """The file is not a readable ONNX model (truncated, corrupted)."""


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
    _fsync(folder / WEIGHTS_NAME)
    model = onnx.load(str(folder / "whole.onnx"), load_external_data=False)
    (folder / "whole.onnx").unlink()
    return model


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
        _fsync(folder / location)  # before the stamp that makes the folder trusted
    return len(weights)


GRAPH_NAME = "model.onnx"  # a model kept whole (BERT, a synthesizer that cannot be split)


def prepared_whole(source: Path, cache_root: Path) -> Path | None:
    """The weightless graph of `source` made by `make_whole`, if it is there."""
    folder = model_folder(source, cache_root)
    stamp = read_stamp(folder, source)
    graph = folder / GRAPH_NAME
    return graph if stamp and stamp.get("kind") == "whole" and graph.is_file() else None


def make_whole(source: Path, cache_root: Path, session_options, unsigned_int8: bool = False) -> Path:
    """`source`'s graph, weights apart and constants folded, in its model folder; with
    `unsigned_int8`, its integer products' weights made unsigned (unsigned_integer_weights)."""
    folder = model_folder(source, cache_root)
    clear_folder(folder)
    model = weightless(source, folder)
    fold_constants(model, folder, session_options)
    if unsigned_int8:
        unsigned_integer_weights(model, folder)
    save_graph(model, folder / GRAPH_NAME)
    write_stamp(folder, source, kind="whole", unsigned_int8=unsigned_int8)
    return folder / GRAPH_NAME

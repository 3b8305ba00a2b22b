"""The ONNX file read as protobuf wire format over a memory map: a model's graph with
its tensors made external data (graph_without_weights), and a saved graph's external
tensors as arrays over one map of their files (shared_weights).

The weights never pass through Python: each initializer's `raw_data` field
is replaced by its place in another file (weights.py copies the bytes there).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

MIN_EXTERNAL_BYTES = 1024  # smaller tensors stay in the graph
# int64 tensors are shapes, pads, axes: shape inference must read them, and it
# cannot read external data. They stay in the graph (they are small).
INLINE_TYPES = {7}  # TensorProto.INT64

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

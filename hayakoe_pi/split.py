"""Cutting a published synthesizer.onnx into "everything before the decoder" and the decoder.

The HiFi-GAN decoder is convolutional, so it can run over windows of latent
frames (with enough overlap to cover its receptive field) while the flow
before it, which attends over the whole sentence, runs once. The cut is made
once per model file and kept in a cache folder; later loads do not need the `onnx`
package at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("hayakoe_pi.split")

FRONT_NAME = "synthesizer.front.onnx"
DECODER_NAME = "synthesizer.decoder.onnx"
STAMP_NAME = "split.json"
# Weight names of the decoder's first convolution and its speaker conditioning
# in Style-Bert-VITS2 exports (HayaKoe keeps PyTorch's parameter names).
CONV_PRE_SUFFIX = "dec.conv_pre.weight"
COND_SUFFIX = "dec.cond.weight"


@dataclass
class SplitModel:
    front: Path  # synthesizer inputs → z (decoder input), g (speaker), [durations]
    decoder: Path  # z, g → audio
    z_name: str
    g_name: str | None


def _stamp(source: Path) -> dict:
    st = source.stat()
    return {"source": str(source.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "version": 1}


def _split_dir(source: Path, cache_root: Path) -> Path:
    """Never beside the model: model folders may be read-only or shared."""
    digest = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]
    return cache_root / digest


def cached_split(source: Path, cache_root: Path) -> SplitModel | None:
    folder = _split_dir(source, cache_root)
    try:
        stamp = json.loads((folder / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None
    if {k: stamp.get(k) for k in ("source", "size", "mtime_ns", "version")} != _stamp(source):
        return None
    if not ((folder / FRONT_NAME).is_file() and (folder / DECODER_NAME).is_file()):
        return None
    return SplitModel(folder / FRONT_NAME, folder / DECODER_NAME, stamp["z"], stamp.get("g"))


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


class UnreadableModel(ValueError):
    """The file is not a readable ONNX model (truncated, corrupted)."""


def _external_names(node) -> set[str]:
    """Tensors a node reads, including those its subgraphs (If, Loop) take from outside."""
    names = set(node.input)
    for attr in node.attribute:
        graphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
        for graph in graphs:
            inner = {o for n in graph.node for o in n.output}
            inner |= {i.name for i in graph.input} | {i.name for i in graph.initializer}
            for n in graph.node:
                names |= _external_names(n) - inner
    names.discard("")
    return names


def _subgraph(model, inputs: list[str], outputs: list[str]):
    """The part of `model` computing `outputs` from `inputs`, or None if it needs anything else."""
    import onnx
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
                todo.extend(_external_names(graph.node[index]))
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
    part = helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version,
                             producer_name="hayakoe-pi split")
    onnx.checker.check_model(part)
    return part


def split_synthesizer(source: Path, cache_root: Path) -> SplitModel | None:
    """The cached split of `source`, making it first if needed; None if it cannot be split."""
    found = cached_split(source, cache_root)
    if found:
        return found
    try:
        import onnx
    except ImportError:
        log.warning("the onnx package is missing: decoding %s in one piece", source)
        return None
    try:
        model = onnx.load(str(source))
    except Exception as e:  # protobuf's DecodeError and friends
        raise UnreadableModel(str(e) or type(e).__name__) from None
    names = _decoder_inputs(model)
    if names is None:
        log.warning("no HiFi-GAN decoder found in %s: decoding in one piece", source)
        return None
    z, g = names
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
    del model
    folder = _split_dir(source, cache_root)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for part, name in ((front, FRONT_NAME), (decoder, DECODER_NAME)):
        tmp = folder / f"{name}.tmp"
        onnx.save(part, str(tmp))
        tmp.replace(folder / name)
    (folder / STAMP_NAME).write_text(json.dumps({**_stamp(source), "z": z, "g": g}))
    log.info("split %s into its decoder and the rest (%s)", source.name, folder)
    return SplitModel(folder / FRONT_NAME, folder / DECODER_NAME, z, g)


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

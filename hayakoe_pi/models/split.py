"""Cutting a published synthesizer.onnx into "everything before the decoder" and the decoder.

The HiFi-GAN decoder is convolutional, so it can run over windows of latent
frames (with enough overlap to cover its receptive field) while the flow
before it, which attends over the whole sentence, runs once. The cut is made
once per model file and kept in a cache folder, with the decoder's other
forms (forms.py, rows.py) where they give the same samples; later loads do
not need the `onnx` package at all.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from . import forms
from .folders import clear_folder, model_folder, read_stamp, save_graph, write_stamp
from .graphs import input_channels, names_read
from .rows import decoder_in_rows
from .weights import fold_constants, weightless

log = logging.getLogger("hayakoe_pi.split")

FRONT_NAME = "front.onnx"
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
    decoders = {form: folder / forms.DECODER_FORMS[form] for form in stamp["forms"]}
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
            channels = input_channels(graph, name)
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
    save_graph(decoder, folder / forms.DECODER_FORMS["1d"])
    made = ["1d"]
    if forms.blocked_conv_kernels():
        made += [form for form in forms.TWO_D_FROM if _save_2d_form(decoder, form, folder, z, g, source, session_options)]
    else:
        log.info("decoder of %s: no 2-D forms (ONNX Runtime has no blocked convolution kernels on "
                 "this CPU: they would compute as the 1-D one)", source)
    # last: see folders.py
    write_stamp(folder, source, kind="split", z=z, g=g, forms=made, split_version=SPLIT_VERSION)
    log.info("split %s into its decoder and the rest (%s)", source.name, folder)
    return cached_split(source, cache_root)


def _save_2d_form(decoder, form: str, folder: Path, z: str, g: str | None, source: Path, session_options) -> bool:
    """Save a rewritten form of the decoder if it gives the same samples as the one cut."""
    import onnx

    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(decoder)
    path = folder / forms.DECODER_FORMS[form]
    try:
        rewritten = forms.decoder_as_2d(rewritten, forms.TWO_D_FROM[form])
        if rewritten is None:
            return False  # not rewritable, or the same graph as another form
        if form == "2d":
            rewritten = decoder_in_rows(rewritten, forms.ROWS, forms.ROWS_BELOW_CHANNELS) or rewritten
        save_graph(rewritten, path)
        if _same_output(folder / forms.DECODER_FORMS["1d"], path, z, g, session_options):
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

"""Which of the decoder's convolutions run in 8 bits: grouped by stage (the upsampling they
follow), the stages kept FP32 from the output end first.

Measured on trained decoders (issue 55, bench/README.md): 8 bits in the layers at the
output rate put a broadband noise into the quiet high bands of real speech, which random
weights never showed; the first, widest stages in 8 bits are harmless and hold most of the
work (HiFi-GAN V1: 22 % and 44 % of the multiply-adds in its first two stages). So prepare
tries every stage in 8 bits, then keeps the last one FP32, then the last two, … and takes
the first that the gate lets through (quantize.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .graphs import attributes, weight_shapes

# A stage with less of the work than this is never a choice of its own (a speaker
# conditioning at the latents' rate: 0.3 %): it goes with its neighbours.
MIN_STAGE_SHARE = 0.01


@dataclass
class Stage:
    index: int  # 0: before the first upsampler; n: after the n-th
    rate: int  # samples a latent frame at this stage
    convs: list[str] = field(default_factory=list)  # its convolutions, by node name
    share: float = 0.0  # of the decoder's multiply-adds


def conv_stages(model) -> list[Stage]:
    """The decoder's stages, input end first, each with its convolutions and its share of the
    work; a convolution's stage is the number of upsamplers (transposed convolutions) before it."""
    graph = model.graph
    shapes = weight_shapes(graph)
    depth: dict[str, int] = {}
    rates = [1]
    macs: dict[int, float] = {}
    upsampling = 0.0  # the transposed convolutions' multiply-adds: FP32 always, in no stage's share
    stages: dict[int, Stage] = {}
    for node in graph.node:
        d = max((depth.get(name, 0) for name in node.input if name), default=0)
        if node.op_type == "ConvTranspose":
            stride = attributes(node).get("strides", [1])[0]
            if d + 1 >= len(rates):
                rates.append(rates[-1] * stride)
            upsampling += _macs(shapes.get(node.input[1])) * rates[d + 1] / stride
        for name in node.output:
            depth[name] = d + (node.op_type == "ConvTranspose")
        if node.op_type == "Conv":
            stage = stages.setdefault(d, Stage(d, rates[min(d, len(rates) - 1)]))
            stage.convs.append(node.name)
            macs[d] = macs.get(d, 0.0) + _macs(shapes.get(node.input[1])) * stage.rate
    total = sum(macs.values()) + upsampling or 1.0
    for index, stage in stages.items():
        stage.share = macs.get(index, 0.0) / total
    return [stages[i] for i in sorted(stages)]


def _macs(shape: list[int] | None) -> float:
    """Multiply-adds of a convolution's weight for each sample it writes ([out, in / group, k]);
    a transposed one's ([in, out / group, k]) for each it reads, to be divided by its stride."""
    return float(shape[0] * shape[1] * shape[2]) if shape and len(shape) == 3 else 0.0


def fp32_choices(stages: list[Stage], ends: list[str]) -> list[list[Stage]]:
    """The stages to keep FP32, in the order tried: none, then the last, the last two, …,
    up to all but the first stage that has a convolution of its own in 8 bits."""
    inner = [s for s in stages if set(s.convs) - set(ends) and s.share >= MIN_STAGE_SHARE]
    return [inner[len(inner) - kept:] if kept else [] for kept in range(len(inner))]


def excluded(stages: list[Stage], ends: list[str]) -> list[str]:
    """The convolutions left FP32: the decoder's two ends and every convolution of `stages`."""
    return list(dict.fromkeys([*ends, *(name for s in stages for name in s.convs)]))


def describe(stages: list[Stage]) -> str:
    if not stages:
        return "every stage in 8 bits"
    return "FP32 kept in " + ", ".join(f"stage {s.index} (×{s.rate}, {s.share:.0%} of the work)" for s in stages)

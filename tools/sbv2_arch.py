"""Inference-only torch re-implementation of a Style-Bert-VITS2 "JP-Extra" style
synthesizer, used only to build random-weight ONNX models for tests/benchmarks.

Written from the published architecture description (VITS / VITS2 / SBV2 JP-Extra):
text encoder (symbol + tone + language embeddings, BERT and style projections,
relative-position self-attention transformer with speaker conditioning), a
stochastic (spline-flow) and a deterministic duration predictor mixed by
``sdp_ratio``, length regulation, a transformer-coupling normalizing flow run in
reverse, and a HiFi-GAN generator.  Only the inference path exists here; the
training-only parts (posterior encoder, SDP posterior flows, discriminators)
are not built.

Nothing in this module is needed at run time of hayakoe-pi (torch is a tools-only
dependency).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# Sizes fixed by the SBV2 symbol table (shared by all JP-Extra models).
N_SYMBOLS = 112
N_TONES = 12
N_LANGUAGES = 3
BERT_DIM = 1024
STYLE_DIM = 256


# --------------------------------------------------------------------------
# hyperparameters
# --------------------------------------------------------------------------


@dataclass
class ArchParams:
    n_speakers: int = 1
    hidden_channels: int = 192
    inter_channels: int = 192
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3
    resblock: str = "1"
    resblock_kernel_sizes: list[int] = field(default_factory=lambda: [3, 7, 11])
    resblock_dilation_sizes: list[list[int]] = field(
        default_factory=lambda: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    )
    upsample_rates: list[int] = field(default_factory=lambda: [8, 8, 2, 2, 2])
    upsample_initial_channel: int = 512
    upsample_kernel_sizes: list[int] = field(default_factory=lambda: [16, 16, 8, 2, 2])
    gin_channels: int = 512
    # Not part of a standard SBV2 config.json "model" block (fixed in SBV2 code);
    # exposed so that tiny fixtures can stay small.
    n_layers_trans_flow: int = 6
    n_flows: int = 4
    flow_kernel_size: int = 5
    dp_filter_channels: int = 256
    sdp_kernel_size: int = 3
    sdp_n_flows: int = 4
    rel_window: int = 4
    spk_cond_layer: int = 2

    @classmethod
    def from_sbv2_config(cls, cfg: dict[str, Any], **overrides: Any) -> "ArchParams":
        """Build from a parsed SBV2 config.json (uses data.n_speakers and model.*)."""
        names = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in cfg.get("model", {}).items() if k in names}
        kw["n_speakers"] = int(cfg.get("data", {}).get("n_speakers", 1))
        kw.update(overrides)
        return cls(**kw)

    @property
    def hop_length(self) -> int:
        return int(math.prod(self.upsample_rates))


# --------------------------------------------------------------------------
# small building blocks
# --------------------------------------------------------------------------


def length_mask(lengths: torch.Tensor, max_len: torch.Tensor | int) -> torch.Tensor:
    """[b] lengths -> float mask [b, 1, max_len]."""
    pos = torch.arange(max_len, device=lengths.device)
    return (pos.unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(1).float()


class ChannelNorm(nn.Module):
    """LayerNorm over the channel axis of a [b, c, t] tensor."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.channels = channels
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.transpose(1, 2), (self.channels,), self.weight, self.bias, self.eps)
        return y.transpose(1, 2)


class RelativeSelfAttention(nn.Module):
    """Multi-head self-attention with windowed relative-position embeddings
    (keys and values), one embedding table shared by all heads."""

    def __init__(self, channels: int, n_heads: int, window: int) -> None:
        super().__init__()
        assert channels % n_heads == 0
        self.n_heads = n_heads
        self.head_dim = channels // n_heads
        self.window = window
        self.to_q = nn.Conv1d(channels, channels, 1)
        self.to_k = nn.Conv1d(channels, channels, 1)
        self.to_v = nn.Conv1d(channels, channels, 1)
        self.to_out = nn.Conv1d(channels, channels, 1)
        span = 2 * window + 1
        std = self.head_dim**-0.5
        self.rel_key = nn.Parameter(torch.randn(1, span, self.head_dim) * std)
        self.rel_value = nn.Parameter(torch.randn(1, span, self.head_dim) * std)
        for conv in (self.to_q, self.to_k, self.to_v):
            nn.init.xavier_uniform_(conv.weight)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t = x.shape
        return x.reshape(b, self.n_heads, self.head_dim, t).transpose(2, 3)  # [b,h,t,d]

    def forward(self, x: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        b, c, t = x.shape
        q = self._heads(self.to_q(x)) * (self.head_dim**-0.5)
        k = self._heads(self.to_k(x))
        v = self._heads(self.to_v(x))

        # offset table: off[i, j] = j - i ; relative slot = off + window
        pos = torch.arange(t, device=x.device)
        off = pos.unsqueeze(0) - pos.unsqueeze(1)  # [t(i), t(j)]
        in_window = (off.abs() <= self.window).float()
        slot = off.clamp(-self.window, self.window) + self.window  # [t, t]

        logits = torch.matmul(q, k.transpose(2, 3))  # [b,h,t,t]
        rel_logits = torch.matmul(q, self.rel_key.transpose(1, 2).unsqueeze(0))  # [b,h,t,span]
        idx = slot.unsqueeze(0).unsqueeze(0).expand(b, self.n_heads, t, t)
        logits = logits + torch.gather(rel_logits, 3, idx) * in_window

        logits = logits.masked_fill(pair_mask == 0, -1e4)
        probs = torch.softmax(logits, dim=-1)
        out = torch.matmul(probs, v)

        # probability mass at relative offset s-window for every query position i:
        # column j = i + s - window of the probability matrix (zero if outside).
        span = 2 * self.window + 1
        rel = torch.arange(span, device=x.device) - self.window  # [span]
        cols = pos.unsqueeze(1) + rel.unsqueeze(0)  # [t, span]
        col_ok = ((cols >= 0) & (cols < t)).float()
        cols = torch.minimum(cols.clamp(min=0), pos[-1])
        cidx = cols.unsqueeze(0).unsqueeze(0).expand(b, self.n_heads, t, span)
        rel_probs = torch.gather(probs, 3, cidx) * col_ok  # [b,h,t,span]
        out = out + torch.matmul(rel_probs, self.rel_value.unsqueeze(0))

        out = out.transpose(2, 3).reshape(b, c, t)
        return self.to_out(out)


class ConvFeedForward(nn.Module):
    def __init__(self, channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.up = nn.Conv1d(channels, filter_channels, kernel_size)
        self.down = nn.Conv1d(filter_channels, channels, kernel_size)

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        k = self.kernel_size
        if k == 1:
            return x
        return F.pad(x, ((k - 1) // 2, k // 2))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(self._pad(x * mask)))
        return self.down(self._pad(h * mask)) * mask


class RelTransformer(nn.Module):
    """Post-norm transformer stack; the speaker vector (projected) is added to the
    hidden state before block ``cond_layer`` (VITS2 style)."""

    def __init__(
        self,
        channels: int,
        filter_channels: int,
        n_heads: int,
        n_layers: int,
        kernel_size: int,
        gin_channels: int,
        cond_layer: int = 2,
        window: int = 4,
    ) -> None:
        super().__init__()
        self.cond_layer = cond_layer if gin_channels > 0 else -1
        if gin_channels > 0:
            assert cond_layer < n_layers, "need more layers than the conditioning index"
            self.spk_proj = nn.Linear(gin_channels, channels)
        self.attn = nn.ModuleList(
            [RelativeSelfAttention(channels, n_heads, window) for _ in range(n_layers)]
        )
        self.attn_norm = nn.ModuleList([ChannelNorm(channels) for _ in range(n_layers)])
        self.ffn = nn.ModuleList(
            [ConvFeedForward(channels, filter_channels, kernel_size) for _ in range(n_layers)]
        )
        self.ffn_norm = nn.ModuleList([ChannelNorm(channels) for _ in range(n_layers)])

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None
    ) -> torch.Tensor:
        pair_mask = mask.unsqueeze(2) * mask.unsqueeze(3)  # [b,1,t,t]
        x = x * mask
        for i, (att, n1, ffn, n2) in enumerate(
            zip(self.attn, self.attn_norm, self.ffn, self.ffn_norm)
        ):
            if i == self.cond_layer and g is not None:
                x = (x + self.spk_proj(g.transpose(1, 2)).transpose(1, 2)) * mask
            x = n1(x + att(x, pair_mask))
            x = n2(x + ffn(x, mask))
        return x * mask


# --------------------------------------------------------------------------
# text encoder
# --------------------------------------------------------------------------


class PhonemeEncoder(nn.Module):
    def __init__(self, p: ArchParams) -> None:
        super().__init__()
        h = p.hidden_channels
        self.hidden = h
        self.inter = p.inter_channels
        self.symbol_emb = nn.Embedding(N_SYMBOLS, h)
        self.tone_emb = nn.Embedding(N_TONES, h)
        self.lang_emb = nn.Embedding(N_LANGUAGES, h)
        for emb in (self.symbol_emb, self.tone_emb, self.lang_emb):
            nn.init.normal_(emb.weight, 0.0, h**-0.5)
        self.bert_in = nn.Conv1d(BERT_DIM, h, 1)
        self.style_in = nn.Linear(STYLE_DIM, h)
        self.body = RelTransformer(
            h, p.filter_channels, p.n_heads, p.n_layers, p.kernel_size,
            p.gin_channels, p.spk_cond_layer, p.rel_window,
        )
        self.to_stats = nn.Conv1d(h, 2 * p.inter_channels, 1)

    def forward(self, x, x_lengths, tone, language, bert, style_vec, g):
        emb = (
            self.symbol_emb(x)
            + self.tone_emb(tone)
            + self.lang_emb(language)
            + self.bert_in(bert).transpose(1, 2)
            + self.style_in(style_vec.unsqueeze(1))
        ) * math.sqrt(self.hidden)
        h = emb.transpose(1, 2)  # [b, h, t]
        mask = length_mask(x_lengths, h.size(2))
        h = self.body(h * mask, mask, g)
        stats = self.to_stats(h) * mask
        mean, log_std = stats[:, : self.inter], stats[:, self.inter :]
        return h, mean, log_std, mask


# --------------------------------------------------------------------------
# duration predictors
# --------------------------------------------------------------------------


class ConvDurationPredictor(nn.Module):
    """Deterministic predictor: two conv+relu+norm blocks and a 1x1 projection to log-duration."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int, gin_channels: int) -> None:
        super().__init__()
        pad = kernel_size // 2
        self.conv_a = nn.Conv1d(channels, filter_channels, kernel_size, padding=pad)
        self.norm_a = ChannelNorm(filter_channels)
        self.conv_b = nn.Conv1d(filter_channels, filter_channels, kernel_size, padding=pad)
        self.norm_b = ChannelNorm(filter_channels)
        self.out = nn.Conv1d(filter_channels, 1, 1)
        self.spk = nn.Conv1d(gin_channels, channels, 1) if gin_channels > 0 else None

    def forward(self, x, mask, g=None):
        if self.spk is not None and g is not None:
            x = x + self.spk(g)
        x = self.norm_a(torch.relu(self.conv_a(x * mask)))
        x = self.norm_b(torch.relu(self.conv_b(x * mask)))
        return self.out(x * mask) * mask


class DilatedSeparableStack(nn.Module):
    """Residual stack of dilated depthwise conv + 1x1 conv, with norms and GELU."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int) -> None:
        super().__init__()
        self.depthwise = nn.ModuleList()
        self.pointwise = nn.ModuleList()
        self.norm_d = nn.ModuleList()
        self.norm_p = nn.ModuleList()
        for i in range(n_layers):
            dil = kernel_size**i
            self.depthwise.append(
                nn.Conv1d(channels, channels, kernel_size, groups=channels,
                          dilation=dil, padding=(kernel_size - 1) * dil // 2)
            )
            self.pointwise.append(nn.Conv1d(channels, channels, 1))
            self.norm_d.append(ChannelNorm(channels))
            self.norm_p.append(ChannelNorm(channels))

    def forward(self, x, mask, cond=None):
        if cond is not None:
            x = x + cond
        for dw, pw, nd, np_ in zip(self.depthwise, self.pointwise, self.norm_d, self.norm_p):
            y = F.gelu(nd(dw(x * mask)))
            y = F.gelu(np_(pw(y)))
            x = x + y
        return x * mask


def inverse_rq_spline(
    y: torch.Tensor,
    raw_w: torch.Tensor,
    raw_h: torch.Tensor,
    raw_d: torch.Tensor,
    bound: float,
    min_w: float = 1e-3,
    min_h: float = 1e-3,
    min_d: float = 1e-3,
) -> torch.Tensor:
    """Inverse of a monotone rational-quadratic spline on [-bound, bound] with identity
    (linear) tails.  y: [...]; raw_w/raw_h: [..., K]; raw_d: [..., K-1] (interior knots).
    Returns x with spline(x) = y."""
    k = raw_w.size(-1)
    # knot derivative at both ends is fixed to 1 (matches the identity tails)
    edge = math.log(math.expm1(1.0 - min_d))
    edge_t = torch.full_like(raw_d[..., :1], edge)
    deriv = min_d + F.softplus(torch.cat([edge_t, raw_d, edge_t], dim=-1))  # [..., K+1]

    def knots(raw: torch.Tensor, min_size: float) -> torch.Tensor:
        frac = min_size + (1.0 - min_size * k) * torch.softmax(raw, dim=-1)
        cum = torch.cumsum(frac, dim=-1)
        cum = torch.cat([torch.zeros_like(cum[..., :1]), cum], dim=-1)
        cum = 2.0 * bound * cum - bound  # [..., K+1], from -bound
        # pin the end points exactly
        first = torch.full_like(cum[..., :1], -bound)
        last = torch.full_like(cum[..., :1], bound)
        return torch.cat([first, cum[..., 1:-1], last], dim=-1)

    xk = knots(raw_w, min_w)  # x knot positions
    yk = knots(raw_h, min_h)  # y knot positions

    inside = (y >= -bound) & (y <= bound)
    yc = y.clamp(-bound, bound)
    # bin: number of interior y-knots <= y  (0..K-1)
    b = (yc.unsqueeze(-1) >= yk[..., 1:-1]).long().sum(-1, keepdim=True)

    def pick(t: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return torch.gather(t, -1, b + offset)[..., 0]

    x0, x1 = pick(xk), pick(xk, 1)
    y0, y1 = pick(yk), pick(yk, 1)
    d0, d1 = pick(deriv), pick(deriv, 1)
    bw = x1 - x0
    bh = y1 - y0
    slope = bh / bw
    dy = yc - y0
    s = d0 + d1 - 2.0 * slope
    qa = dy * s + bh * (slope - d0)
    qb = bh * d0 - dy * s
    qc = -slope * dy
    disc = (qb * qb - 4.0 * qa * qc).clamp(min=0.0)
    theta = (2.0 * qc) / (-qb - torch.sqrt(disc))
    x = x0 + theta * bw
    return torch.where(inside, x, y)


class SplineCoupling(nn.Module):
    """2-channel coupling: channel 0 conditions a rational-quadratic spline on channel 1."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int = 3,
                 n_bins: int = 10, bound: float = 5.0) -> None:
        super().__init__()
        self.channels = channels
        self.n_bins = n_bins
        self.bound = bound
        self.inp = nn.Conv1d(1, channels, 1)
        self.stack = DilatedSeparableStack(channels, kernel_size, n_layers)
        self.params = nn.Conv1d(channels, 3 * n_bins - 1, 1)

    def inverse(self, z, mask, cond):
        a, b = z[:, :1], z[:, 1:]
        h = self.stack(self.inp(a), mask, cond)
        h = self.params(h) * mask  # [B, 3K-1, T]
        h = h.transpose(1, 2)  # [B, T, 3K-1]
        k = self.n_bins
        scale = math.sqrt(self.channels)
        b_new = inverse_rq_spline(
            b.squeeze(1), h[..., :k] / scale, h[..., k : 2 * k] / scale, h[..., 2 * k :], self.bound
        ).unsqueeze(1)
        return torch.cat([a, b_new], dim=1) * mask


class ChannelAffine(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(channels, 1))
        self.log_scale = nn.Parameter(torch.zeros(channels, 1))

    def inverse(self, z, mask):
        return (z - self.shift) * torch.exp(-self.log_scale) * mask


class FlowDurationPredictor(nn.Module):
    """Stochastic duration predictor, sampling direction only: 2-channel noise is pushed
    through the inverse flows conditioned on the text hidden states; channel 0 is log w."""

    def __init__(self, channels: int, kernel_size: int, n_flows: int, gin_channels: int) -> None:
        super().__init__()
        self.inp = nn.Conv1d(channels, channels, 1)
        self.stack = DilatedSeparableStack(channels, kernel_size, 3)
        self.out = nn.Conv1d(channels, channels, 1)
        self.spk = nn.Conv1d(gin_channels, channels, 1) if gin_channels > 0 else None
        self.affine = ChannelAffine(2)
        # the first coupling after the affine layer is never used when sampling,
        # so only the remaining ones are built
        self.couplings = nn.ModuleList(
            [SplineCoupling(channels, kernel_size) for _ in range(n_flows - 1)]
        )

    def sample_log_durations(self, x, mask, g, noise_scale):
        h = self.inp(x)
        if self.spk is not None and g is not None:
            h = h + self.spk(g)
        h = self.out(self.stack(h, mask)) * mask
        z = torch.randn(x.size(0), 2, x.size(2), dtype=x.dtype, device=x.device) * noise_scale
        for coupling in reversed(self.couplings):
            z = z.flip(1)
            z = coupling.inverse(z, mask, h)
        z = z.flip(1)
        z = self.affine.inverse(z, mask)
        return z[:, :1]


# --------------------------------------------------------------------------
# normalizing flow
# --------------------------------------------------------------------------


class TransformerCoupling(nn.Module):
    """Mean-only affine coupling whose shift comes from a relative transformer."""

    def __init__(self, p: ArchParams) -> None:
        super().__init__()
        self.half = p.inter_channels // 2
        self.inp = nn.Conv1d(self.half, p.hidden_channels, 1)
        self.body = RelTransformer(
            p.hidden_channels, p.filter_channels, p.n_heads, p.n_layers_trans_flow,
            p.flow_kernel_size, p.gin_channels, p.spk_cond_layer, p.rel_window,
        )
        self.shift = nn.Conv1d(p.hidden_channels, self.half, 1)

    def inverse(self, z, mask, g):
        a, b = z[:, : self.half], z[:, self.half :]
        h = self.body(self.inp(a) * mask, mask, g)
        b = (b - self.shift(h) * mask) * mask
        return torch.cat([a, b], dim=1)


class CouplingFlow(nn.Module):
    def __init__(self, p: ArchParams) -> None:
        super().__init__()
        assert p.inter_channels % 2 == 0
        self.layers = nn.ModuleList([TransformerCoupling(p) for _ in range(p.n_flows)])

    def inverse(self, z, mask, g):
        # forward direction is (coupling, channel flip) x n; undo it back to front
        for layer in reversed(self.layers):
            z = z.flip(1)
            z = layer.inverse(z, mask, g)
        return z


# --------------------------------------------------------------------------
# HiFi-GAN decoder
# --------------------------------------------------------------------------

LEAK = 0.1


class DilatedResBlock(nn.Module):
    """HiFi-GAN residual block, variant "1" (pairs of dilated + plain convs) or "2"."""

    def __init__(self, channels: int, kernel_size: int, dilations: list[int], variant: str) -> None:
        super().__init__()
        self.variant = variant

        def conv(d: int) -> nn.Conv1d:
            return nn.Conv1d(channels, channels, kernel_size, dilation=d,
                             padding=(kernel_size - 1) * d // 2)

        dil = list(dilations) if variant == "1" else list(dilations)[:2]
        self.dilated = nn.ModuleList([conv(d) for d in dil])
        self.plain = nn.ModuleList([conv(1) for _ in dil]) if variant == "1" else None

    def forward(self, x):
        for i, c in enumerate(self.dilated):
            y = c(F.leaky_relu(x, LEAK))
            if self.plain is not None:
                y = self.plain[i](F.leaky_relu(y, LEAK))
            x = x + y
        return x


class HiFiGANDecoder(nn.Module):
    """Latent frames z [b, inter_channels, frames] + speaker vector g [b, gin, 1]
    -> waveform [b, 1, frames * prod(upsample_rates)] in (-1, 1)."""

    def __init__(self, p: ArchParams) -> None:
        super().__init__()
        c0 = p.upsample_initial_channel
        self.pre = nn.Conv1d(p.inter_channels, c0, 7, padding=3)
        self.spk = nn.Conv1d(p.gin_channels, c0, 1) if p.gin_channels > 0 else None
        self.n_kernels = len(p.resblock_kernel_sizes)
        self.upsamplers = nn.ModuleList()
        self.mrf = nn.ModuleList()
        ch = c0
        for i, (rate, k) in enumerate(zip(p.upsample_rates, p.upsample_kernel_sizes)):
            nxt = c0 // (2 ** (i + 1))
            self.upsamplers.append(nn.ConvTranspose1d(ch, nxt, k, rate, padding=(k - rate) // 2))
            for rk, rd in zip(p.resblock_kernel_sizes, p.resblock_dilation_sizes):
                self.mrf.append(DilatedResBlock(nxt, rk, rd, p.resblock))
            ch = nxt
        self.post = nn.Conv1d(ch, 1, 7, padding=3, bias=False)

    def pre_activation(self, z, g=None):
        x = self.pre(z)
        if self.spk is not None and g is not None:
            x = x + self.spk(g)
        for i, up in enumerate(self.upsamplers):
            x = up(F.leaky_relu(x, LEAK))
            blocks = self.mrf[i * self.n_kernels : (i + 1) * self.n_kernels]
            acc = blocks[0](x)
            for blk in blocks[1:]:
                acc = acc + blk(x)
            x = acc / self.n_kernels
        return self.post(F.leaky_relu(x))

    def forward(self, z, g=None):
        return torch.tanh(self.pre_activation(z, g))


# --------------------------------------------------------------------------
# full synthesizer
# --------------------------------------------------------------------------


class Synthesizer(nn.Module):
    def __init__(self, p: ArchParams) -> None:
        super().__init__()
        self.p = p
        self.speaker_table = nn.Embedding(p.n_speakers, p.gin_channels)
        self.enc = PhonemeEncoder(p)
        self.sdp = FlowDurationPredictor(
            p.hidden_channels, p.sdp_kernel_size, p.sdp_n_flows, p.gin_channels
        )
        self.dp = ConvDurationPredictor(
            p.hidden_channels, p.dp_filter_channels, p.kernel_size, p.gin_channels
        )
        self.flow = CouplingFlow(p)
        self.dec = HiFiGANDecoder(p)

    def speaker(self, sid):
        return self.speaker_table(sid).unsqueeze(-1)  # [b, gin, 1]

    def log_durations(self, h, mask, g, noise_scale_w, sdp_ratio):
        """Per-symbol log frame counts, mixture of both predictors. [b,1,t]"""
        sto = self.sdp.sample_log_durations(h, mask, g, noise_scale_w)
        det = self.dp(h, mask, g)
        return sto * sdp_ratio + det * (1.0 - sdp_ratio)

    def frame_counts(self, x, x_lengths, sid, tone, language, bert, style_vec,
                     length_scale, noise_scale_w, sdp_ratio):
        """Integer-valued (float) frames per input symbol: ceil(exp(logw) * length_scale),
        zero on padding. Also returns encoder outputs for synthesis."""
        g = self.speaker(sid)
        h, mean, log_std, mask = self.enc(x, x_lengths, tone, language, bert, style_vec, g)
        logw = self.log_durations(h, mask, g, noise_scale_w, sdp_ratio)
        frames = torch.ceil(torch.exp(logw) * mask * length_scale)  # [b,1,t]
        return frames, mean, log_std, mask, g

    def forward(self, x, x_lengths, sid, tone, language, bert, style_vec,
                noise_scale, length_scale, noise_scale_w, sdp_ratio):
        frames, mean, log_std, mask, g = self.frame_counts(
            x, x_lengths, sid, tone, language, bert, style_vec,
            length_scale, noise_scale_w, sdp_ratio,
        )
        # length regulation: frame f belongs to symbol i iff start_i <= f < end_i
        end = torch.cumsum(frames, dim=-1)  # [b,1,t]
        start = end - frames
        n_frames = torch.clamp_min(end[:, 0, -1], 1.0).long()  # [b]
        total = n_frames.max()
        f = torch.arange(total, device=x.device).float().view(1, -1, 1)  # [1,T',1]
        align = ((f >= start) & (f < end)).float() * mask  # [b,T',t]
        y_mask = length_mask(n_frames, total)  # [b,1,T']
        mean_y = torch.matmul(align, mean.transpose(1, 2)).transpose(1, 2)
        log_std_y = torch.matmul(align, log_std.transpose(1, 2)).transpose(1, 2)

        z_prior = mean_y + torch.randn_like(mean_y) * torch.exp(log_std_y) * noise_scale
        z = self.flow.inverse(z_prior, y_mask, g)
        audio = self.dec(z * y_mask, g)
        return audio, frames[:, 0]


# --------------------------------------------------------------------------
# export wrappers (fix the ONNX I/O contract)
# --------------------------------------------------------------------------

SYNTH_INPUTS = ["x", "x_lengths", "sid", "tone", "language", "bert", "style_vec",
                "noise_scale", "length_scale", "noise_scale_w", "sdp_ratio"]
DP_INPUTS = ["x", "x_lengths", "sid", "tone", "language", "bert", "style_vec",
             "length_scale", "noise_scale_w", "sdp_ratio"]


class SynthesizerExport(nn.Module):
    def __init__(self, net: Synthesizer, with_durations: bool) -> None:
        super().__init__()
        self.net = net
        self.with_durations = with_durations

    def forward(self, x, x_lengths, sid, tone, language, bert, style_vec,
                noise_scale, length_scale, noise_scale_w, sdp_ratio):
        audio, frames = self.net(x, x_lengths, sid, tone, language, bert, style_vec,
                                 noise_scale, length_scale, noise_scale_w, sdp_ratio)
        if self.with_durations:
            return audio, frames
        return audio


class DurationExport(nn.Module):
    def __init__(self, net: Synthesizer) -> None:
        super().__init__()
        self.net = net

    def forward(self, x, x_lengths, sid, tone, language, bert, style_vec,
                length_scale, noise_scale_w, sdp_ratio):
        frames = self.net.frame_counts(x, x_lengths, sid, tone, language, bert, style_vec,
                                       length_scale, noise_scale_w, sdp_ratio)[0]
        return frames[:, 0]


# --------------------------------------------------------------------------
# BERT stand-in
# --------------------------------------------------------------------------


class TinyCharBert(nn.Module):
    """Stand-in for the Japanese DeBERTa: only honours the I/O contract
    input_ids/attention_mask [b, s] int64 -> hidden_states [b, s, 1024]."""

    def __init__(self, vocab_size: int, emb_dim: int = 16, d_model: int = 64,
                 n_layers: int = 2, n_heads: int = 2, out_dim: int = BERT_DIM) -> None:
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.tok = nn.Embedding(vocab_size, emb_dim)
        nn.init.normal_(self.tok.weight, 0.0, 1.0)
        self.lift = nn.Linear(emb_dim, d_model)
        self.layers = nn.ModuleList()
        for _ in range(n_layers):
            self.layers.append(nn.ModuleDict({
                "qkv": nn.Linear(d_model, 3 * d_model),
                "o": nn.Linear(d_model, d_model),
                "n1": nn.LayerNorm(d_model),
                "ff1": nn.Linear(d_model, 2 * d_model),
                "ff2": nn.Linear(2 * d_model, d_model),
                "n2": nn.LayerNorm(d_model),
            }))
        self.head = nn.Linear(d_model, out_dim)

    def _positions(self, s: torch.Tensor | int, device) -> torch.Tensor:
        pos = torch.arange(s, device=device).float().unsqueeze(1)
        i = torch.arange(self.d_model // 2, device=device).float().unsqueeze(0)
        ang = pos * torch.exp(-math.log(10000.0) * 2.0 * i / self.d_model)
        return torch.cat([torch.sin(ang), torch.cos(ang)], dim=1)  # [s, d]

    def forward(self, input_ids, attention_mask):
        b, s = input_ids.shape
        x = self.lift(self.tok(input_ids)) + self._positions(s, input_ids.device)
        key_ok = attention_mask.unsqueeze(1).unsqueeze(2) > 0  # [b,1,1,s]
        hd = self.d_model // self.n_heads
        for L in self.layers:
            q, k, v = L["qkv"](x).chunk(3, dim=-1)
            q = q.reshape(b, s, self.n_heads, hd).transpose(1, 2)
            k = k.reshape(b, s, self.n_heads, hd).transpose(1, 2)
            v = v.reshape(b, s, self.n_heads, hd).transpose(1, 2)
            att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd)
            att = torch.softmax(att.masked_fill(~key_ok, -1e4), dim=-1)
            y = torch.matmul(att, v).transpose(1, 2).reshape(b, s, self.d_model)
            x = L["n1"](x + L["o"](y))
            x = L["n2"](x + L["ff2"](F.gelu(L["ff1"](x))))
        return self.head(x)


# --------------------------------------------------------------------------
# full-size BERT: DeBERTa-v2-large (Japanese, character level)
# --------------------------------------------------------------------------

# Hyperparameters of ku-nlp/deberta-v2-large-japanese-char-wwm (the BERT of
# Style-Bert-VITS2 JP-Extra), as transformers.DebertaV2Config keywords.
DEBERTA_V2_LARGE_JA_CHAR: dict[str, Any] = {
    "vocab_size": 22012,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 0,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-7,
    "relative_attention": True,
    "max_relative_positions": 512,
    "position_buckets": 256,
    "pos_att_type": ["p2c", "c2p"],
    "share_att_key": True,
    "norm_rel_ebd": "layer_norm",
    "position_biased_input": False,
    "pad_token_id": 0,
}
BERT_HIDDEN_LAYER = -3  # SBV2 takes the third-from-last hidden state


class DebertaHiddenStates(nn.Module):
    """A random-weight DeBERTa-v2 (transformers' ``DebertaV2Model``) with the
    SBV2 BERT contract: input_ids/attention_mask [b, s] int64 ->
    hidden_states [b, s, 1024], the third-from-last hidden state.  Exported as
    is, the last two layers do not reach the output and drop out of the graph."""

    def __init__(self, vocab_size: int | None = None, **overrides: Any) -> None:
        super().__init__()
        from transformers import DebertaV2Config, DebertaV2Model  # tools-only dependency

        cfg = dict(DEBERTA_V2_LARGE_JA_CHAR, **overrides)
        if vocab_size is not None:
            cfg["vocab_size"] = vocab_size
        self.deberta = DebertaV2Model(DebertaV2Config(**cfg))

    def forward(self, input_ids, attention_mask):
        out = self.deberta(input_ids=input_ids, attention_mask=attention_mask,
                           output_hidden_states=True)
        return out.hidden_states[BERT_HIDDEN_LAYER]

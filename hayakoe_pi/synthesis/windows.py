"""A sentence's decoder windows: which latent frames each decodes (margins around
the ones it keeps), planned for a first sound soon, or by the decoder's measured
speed so that each window is ready before playback reaches it (ahead.py)."""

from __future__ import annotations

from collections.abc import Iterator

# Latent frames per decoder window (512 samples each at 44.1 kHz: 256 frames ~3 s).
# Measured on the full-size models: the overlap costs 2 x 16 frames a window
# (25 % at 128 frames, 12 % at 256, 6 % at 512) while the decoder's working
# memory grows with the window (about 50 MB at 256 frames, 120 MB at 512).
DECODER_WINDOW_FRAMES = 256
FIRST_WINDOW_FRAMES = 48


def decoder_windows(frames: int, window: int, margin: int, first: int = FIRST_WINDOW_FRAMES,
                    one_pass_if_fits: bool = True) -> Iterator[tuple[int, int, int, int]]:
    """(start, end, lo, hi): frames start:end are kept from decoding lo:hi.

    A sentence that fits in one window is decoded in one pass (unless told
    otherwise): every window boundary costs 2 x margin frames of extra work.
    Otherwise the first window is short, so the first sound comes soon, and
    the windows double up to `window`.
    """
    if frames <= window and one_pass_if_fits:
        yield 0, frames, 0, frames
        return
    start, size = 0, max(1, min(first, window))
    while start < frames:
        end = min(frames, start + size)
        if frames - end < size // 2:  # no sliver of a last window
            end = frames
        yield start, end, max(0, start - margin), min(frames, end + margin)
        start, size = end, min(window, size * 2)


def paced_windows(frames: int, window: int, margin: int, ratio: float, guard: float, lead: float = 0.0,
                  first: int = FIRST_WINDOW_FRAMES) -> list[tuple[int, int, int, int]]:
    """Windows (as decoder_windows) each decoded before playback reaches it, as long as that allows.

    `ratio`: time to decode a frame (margins counted) over the time a frame
    plays; `lead`: frames still to play before the sentence's first one;
    `guard`: frames kept in hand. All in frames of playing time from now. If
    even a short first window cannot be ready within the lead, the sentence
    starts once it is. Where windows cannot keep ahead of playback from there
    (each boundary costs 2 x margin frames; a CPU slower than real time), the
    plan is the one that lets the sentence start soonest: it waits (the pause
    grows, ahead.py) by the least delay after which every window is in time.
    """
    def in_time(delay: float) -> list[tuple[int, int, int, int]] | None:
        plan: list[tuple[int, int, int, int]] = []
        start = 0
        decoded = 0.0  # when the windows so far will be ready
        plays_at = lead + delay  # when playback reaches the sentence's first frame
        while start < frames:
            room = (plays_at + start - guard - decoded) / ratio  # frames that can be decoded in time
            rest = frames - start
            if rest <= window and rest + (margin if start else 0) <= room:
                size = rest
            else:
                size = min(window, int(room) - 2 * margin)
                if not plan and size < first:  # not within the lead: start once a short one is ready
                    size, plays_at = min(first, rest), None
                elif plan and size < first // 2:
                    return None  # later windows would be late
            end = start + size
            lo, hi = max(0, start - margin), min(frames, end + margin)
            decoded += (hi - lo) * ratio
            if plays_at is None:
                plays_at = decoded + delay
            plan.append((start, end, lo, hi))
            start = end
        return plan

    delay = 0.0
    # the least delay, to a step of a few per cent of it; enough delay always works
    while delay <= (frames + window) * ratio * 2 + guard:
        plan = in_time(delay)
        if plan is not None:
            return plan
        delay += max(first / 4, delay / 16)
    return list(decoder_windows(frames, window, margin, first, one_pass_if_fits=False))

import os
import stat
import time

import numpy as np

from hayakoe_pi.cache import PhraseCache, cache_key, files_fingerprint


def test_round_trip_and_private_files(tmp_path):
    cache = PhraseCache(tmp_path / "c", max_mb=1)
    audio = np.linspace(-1, 1, 1000, dtype=np.float32)
    assert cache.get("k", 44100) is None
    cache.put("k", 44100, audio)
    assert np.array_equal(cache.get("k", 44100), audio)
    assert cache.get("k", 22050) is None  # the sample rate is part of the entry
    (path,) = (tmp_path / "c").glob("*.f32")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_least_recently_used_is_evicted(tmp_path):
    cache = PhraseCache(tmp_path, max_mb=0.01)  # 10 KiB: two entries of 4 KiB fit
    entry = np.zeros(1024, np.float32)  # 4 KiB
    # the cache orders its entries by mtime: set them, not trusting the file system's resolution
    past = time.time() - 1000

    def put(key, used_at):
        before = set(tmp_path.glob("*.f32"))
        cache.put(key, 1, entry)
        (path,) = set(tmp_path.glob("*.f32")) - before
        os.utime(path, (used_at, used_at))
        return path

    a = put("a", past)  # "a" used first,
    put("b", past + 10)  # then "b"
    assert cache.get("a", 1) is not None  # "a" is now the most recent
    assert a.stat().st_mtime > past + 10
    cache.put("c", 1, entry)
    assert cache.get("b", 1) is None
    assert cache.get("a", 1) is not None and cache.get("c", 1) is not None
    assert cache.size_bytes() <= cache.max_bytes


def test_disabled_cache_stores_nothing(tmp_path):
    cache = PhraseCache(tmp_path / "off", max_mb=0)
    cache.put("a", 1, np.zeros(10, np.float32))
    assert cache.get("a", 1) is None and not (tmp_path / "off").exists()


def test_key_changes_with_everything_that_changes_the_sound(tmp_path):
    model = tmp_path / "synthesizer.onnx"
    model.write_bytes(b"v1")
    base = dict(text="はい", voice="v", style="Neutral", style_weight=1.0, speed=1.0,
                model_fingerprint=files_fingerprint([model]))
    keys = {cache_key(**base)}
    for change in (dict(text="いいえ"), dict(voice="w"), dict(style="Happy"), dict(style_weight=0.5),
                   dict(speed=1.1)):
        keys.add(cache_key(**{**base, **change}))
    model.write_bytes(b"version 2")  # a new download of the model
    os.utime(model, ns=(1, 1))
    keys.add(cache_key(**{**base, "model_fingerprint": files_fingerprint([model])}))
    assert len(keys) == 7

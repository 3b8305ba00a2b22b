import logging
import os
import stat
import time

import numpy as np

from hayakoe_pi.speech.cache import PhraseCache, cache_key, files_fingerprint


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


def test_a_store_that_fails_costs_the_cache_only_and_is_logged_once(tmp_path, caplog):
    """Any OSError of a store (here: the entry's name taken by a folder) leaves no temporary
    file and raises nothing; said once until a store works again."""
    cache = PhraseCache(tmp_path, max_mb=1)
    entry = np.zeros(1024, np.float32)
    for key in ("a", "b"):
        (tmp_path / f"{key}-1{PhraseCache.SUFFIX}").mkdir()
        (tmp_path / f"{key}-1{PhraseCache.SUFFIX}" / "in the way").touch()
    with caplog.at_level(logging.INFO, logger="hayakoe_pi"):
        cache.put("a", 1, entry)
        cache.put("b", 1, entry)
        assert sum("cannot store" in r.getMessage() for r in caplog.records) == 1
        cache.put("c", 1, entry)
        assert cache.get("c", 1) is not None
        assert sum("storing again" in r.getMessage() for r in caplog.records) == 1
        cache.put("a", 1, entry)
        assert sum("cannot store" in r.getMessage() for r in caplog.records) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-1.f32", "b-1.f32", "c-1.f32"]


def test_leftover_temporary_files_are_removed_and_every_file_counts(tmp_path):
    leftover = tmp_path / "k-44100.tmp4242-1"  # a store cut by a power cut
    leftover.write_bytes(b"\0" * 8192)
    (tmp_path / "models").mkdir()  # derived models beside the entries: not the cache's
    (tmp_path / "models" / "big.onnx").write_bytes(b"\0" * 20000)
    cache = PhraseCache(tmp_path, max_mb=0.01)
    assert not leftover.exists() and (tmp_path / "models" / "big.onnx").exists()
    cache.put("a", 1, np.zeros(1024, np.float32))
    stray = tmp_path / "b-1.tmp1-2"  # a store being written by another thread counts too
    stray.write_bytes(b"\0" * 8192)
    assert cache.size_bytes() == 4096 + 8192
    cache.put("c", 1, np.zeros(1024, np.float32))
    assert cache.size_bytes() <= cache.max_bytes and cache.get("a", 1) is None

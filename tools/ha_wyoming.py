"""Home Assistant's Wyoming integration on a daemon's Wyoming server, as tools/ha_check.py runs it:
its zeroconf discovery, the config flow by host and port, `tts` through Home Assistant (mp3, its default, and WAV of
the length the server itself gives), and an Assist pipeline that answers with our audio."""

from __future__ import annotations

import asyncio
import io
import wave
from types import SimpleNamespace

from harness import wait_for
from test_wyoming import synthesize  # the tests' own Wyoming client

TEXT = "今日は良い天気です。"


def discovered(ha, timeout: float = 60) -> str:
    """The name of the Wyoming server Home Assistant found by zeroconf (Settings → Devices &
    services → Discovered), as it shows it."""
    def flows():
        ws = ha.ws()
        try:
            return [f for f in ws.call("config_entries/flow/progress")
                    if f["handler"] == "wyoming" and f["context"].get("source") == "zeroconf"]
        finally:
            ws.close()

    found = wait_for(flows, timeout, interval=1, what="Home Assistant to discover the Wyoming server (zeroconf)")
    return found[0]["context"]["title_placeholders"]["name"]


def add_wyoming(ha, port: int) -> str:
    """The integration added as an owner does (Add integration → Wyoming Protocol, host and
    port); its tts entity's id."""
    answer = ha.config_flow("wyoming", {"host": "127.0.0.1", "port": port})
    assert answer["type"] == "create_entry", f"the Wyoming config flow: {answer}"
    ws = ha.ws()
    try:
        entities = [e["entity_id"] for e in ws.call("config/entity_registry/list")
                    if e["platform"] == "wyoming" and e["entity_id"].startswith("tts.")]
    finally:
        ws.close()
    assert len(entities) == 1, f"Wyoming tts entities: {entities}"
    return entities[0]


def fetch_tts(ha, engine: str, options: dict) -> bytes:
    url = ha.ok("POST", "/api/tts_get_url", {"engine_id": engine, "message": TEXT, "language": "ja",
                                             "options": options})
    status, audio = ha.request("GET", url["path"], raw=True, timeout=120)
    assert status == 200, f"tts {options}: HTTP {status}: {audio[:300]!r}"
    return audio


def wav_seconds(data: bytes) -> float:
    """From the bytes after the data chunk's header: Home Assistant streams its WAV (ffmpeg), so
    the header's sizes are not filled in."""
    with wave.open(io.BytesIO(data)) as w:
        frame, rate = w.getsampwidth() * w.getnchannels(), w.getframerate()
    return (len(data) - data.index(b"data") - 8) / frame / rate


def check_tts(ha, engine: str, port: int, step) -> None:
    direct = asyncio.run(synthesize(SimpleNamespace(port=port), TEXT))
    seconds = len(direct.pcm) / direct.starts[0].rate
    mp3 = fetch_tts(ha, engine, {})
    assert mp3[:3] == b"ID3" or (mp3[0] == 0xFF and mp3[1] & 0xE0 == 0xE0), f"not an mp3: {mp3[:16]!r}"
    assert len(mp3) > 1000, f"an mp3 of {len(mp3)} bytes"
    wav = fetch_tts(ha, engine, {"preferred_format": "wav"})
    assert abs(wav_seconds(wav) - seconds) < 0.1 * seconds + 0.05, \
        f"tts WAV of {wav_seconds(wav):.2f} s; the server itself gives {seconds:.2f} s"
    step(f"tts through Home Assistant ({engine}): mp3 ({len(mp3)} bytes) and WAV of {wav_seconds(wav):.2f} s "
         f"(the server's own: {seconds:.2f} s)")


def check_assist(ha, engine: str, step) -> None:
    """An Assist pipeline with the engine as its voice: text in, our audio out."""
    ws = ha.ws()
    try:
        pipeline = ws.call("assist_pipeline/pipeline/create", name="ha-check", language="ja",
                           conversation_engine="conversation.home_assistant", conversation_language="ja",
                           stt_engine=None, stt_language=None, tts_engine=engine, tts_language="ja",
                           tts_voice=None, wake_word_entity=None, wake_word_id=None)
        run = ws.subscribe("assist_pipeline/run", start_stage="intent", end_stage="tts",
                           input={"text": "今何時ですか"}, pipeline=pipeline["id"])
        events = ws.events(run, lambda e: e["type"] in ("run-end", "error"), timeout=120)
    finally:
        ws.close()
    kinds = [e["type"] for e in events]
    assert "error" not in kinds, f"Assist pipeline: {events[-1]}"
    tts_end = next(e for e in events if e["type"] == "tts-end")
    output = tts_end["data"]["tts_output"]
    status, audio = ha.request("GET", output["url"], raw=True, timeout=120)
    assert status == 200 and len(audio) > 1000, f"Assist's answer {output}: HTTP {status}, {len(audio)} bytes"
    speech = next(e for e in events if e["type"] == "intent-end")["data"]["intent_output"]["response"]["speech"]
    step(f"Assist pipeline: {' → '.join(kinds)}; answered {speech.get('plain', {}).get('speech')!r} "
         f"in {len(audio)} bytes of {output.get('mime_type')}")

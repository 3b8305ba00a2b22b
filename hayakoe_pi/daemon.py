"""The appliance: MQTT requests in, speech out of the sound card.

Threads:
- paho's network thread parses each message and queues it (never blocks);
- one worker speaks the queue in order, playing while a synthesis thread of
  the utterance runs ahead of it (ahead.py);
- one control thread applies voice/style/volume changes (a voice may take
  seconds to load);
- the main thread waits for SIGTERM and pings the systemd watchdog while the
  worker makes progress.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
import uuid
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


from . import sdnotify
from .ahead import SynthesisAhead, synthesize_ahead
from .audio import AudioError, Player, check_device, rescan_devices
from .cache import PhraseCache, cache_key, voice_fingerprint
from .config import voice_styles
from .engine import SPEED_RANGE, Engine, TextError
from .models import ModelError, ModelStore
from .mqtt import SETTINGS, BrokerLink, Topics, discovery_messages

log = logging.getLogger("hayakoe_pi")

REQUEST_FIELDS = ("text", "voice", "style", "speed", "volume", "id", "interrupt")
EVENT_TEXT_CHARS = 200  # events quote at most this much of the text
MAX_ID_CHARS = 128
REMEMBERED_IDS = 1000  # ids seen recently, to drop messages the broker delivers twice
AUDIO_ATTEMPTS = 3


class RequestError(ValueError):
    def __init__(self, reason: str, request_id: str | None = None, text: str | None = None):
        super().__init__(reason)
        self.request_id = request_id
        self.text = text


@dataclass
class Job:
    id: str
    text: str
    voice: str | None = None
    style: str | None = None
    speed: float | None = None
    volume: float | None = None  # 0..1
    interrupt: bool = False
    play: bool = True  # False: only synthesize into the cache (prepare)


class Settings:
    """Volume, voice and style as last set over MQTT; kept in a small JSON file."""

    def __init__(self, path: Path, volume: float, voice: str, style: str):
        self.path = path
        self.volume, self.voice, self.style = volume, voice, style
        try:
            saved = json.loads(path.read_text("utf-8"))
            self.volume = float(saved.get("volume", volume))
            self.voice = str(saved.get("voice", voice))
            self.style = str(saved.get("style", style))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, AttributeError) as e:
            log.warning("ignoring unreadable settings file %s (%s)", path, e)

    def save(self) -> None:
        data = {"volume": self.volume, "voice": self.voice, "style": self.style}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data), "utf-8")
            tmp.chmod(0o600)
            tmp.replace(self.path)
        except OSError as e:
            log.warning("cannot save settings to %s (%s)", self.path, e)

    def state(self, name: str) -> str:
        return f"{round(self.volume * 100):d}" if name == "volume" else getattr(self, name)


def _number(value, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number, got {json.dumps(value)[:40]}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low:g} and {high:g}, got {value:g}")
    return float(value)


class Daemon:
    def __init__(self, config: dict, store: ModelStore | None = None):
        self.config = config
        models_dir = Path(config["models"]["dir"]).expanduser()
        self.store = store or ModelStore(models_dir, derived_dir=Path(config["cache"]["dir"]) / "models")
        voice_cfg = config["voice"]
        self.settings = Settings(Path(config["state"]["file"]), config["audio"]["volume"],
                                 voice_cfg["name"], voice_cfg["style"])
        if self.settings.voice not in self.store.voices():
            log.warning("saved voice %r is not installed; using %s", self.settings.voice, voice_cfg["name"])
            self.settings.voice, self.settings.style = voice_cfg["name"], voice_cfg["style"]
        self.engine = Engine(models_dir, voice=self.settings.voice, store=self.store)
        if self.settings.style not in self.engine.styles:
            self.settings.style = voice_cfg["style"] if voice_cfg["style"] in self.engine.styles \
                else self.engine.styles[0]
        self.player = Player(config["audio"]["device"])
        self.cache = PhraseCache(config["cache"]["dir"], config["cache"]["max_mb"])
        self.topics = Topics(config["mqtt"]["topic_prefix"], config["mqtt"]["discovery_prefix"])
        self.link = BrokerLink(config["mqtt"], self.topics, self.on_message, self._on_connected)

        self.queue: deque[Job] = deque()
        self.cond = threading.Condition()
        self.cut = threading.Event()  # stop the utterance being played
        self.shutting_down = threading.Event()
        self.recent_ids: OrderedDict[str, None] = OrderedDict()
        self.progress = time.monotonic()  # last sign of life from the worker
        self.busy = False
        self.speaking: SynthesisAhead | None = None  # the utterance in progress
        self.control = ThreadPoolExecutor(max_workers=1, thread_name_prefix="control")
        self.worker = threading.Thread(target=self._work, name="speaker", daemon=True)
        self.wyoming = None  # the Wyoming server for Home Assistant Assist, when enabled
        if config.get("wyoming", {}).get("enabled"):
            from .wyoming import WyomingServer

            self.wyoming = WyomingServer(self)

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.worker.start()
        self.link.start()
        if self.wyoming is not None:
            self.wyoming.start()

    def shutdown(self) -> None:
        log.info("shutting down")
        sdnotify.notify("STOPPING=1")
        self.shutting_down.set()
        self.cut.set()
        with self.cond:
            self.cond.notify_all()
        self.worker.join(timeout=1.5)
        if self.speaking is not None:  # let the decoder window in progress end
            self.speaking.join(timeout=2.0)
        self.control.shutdown(wait=False, cancel_futures=True)
        if self.wyoming is not None:
            self.wyoming.stop(timeout=2.0)
        self.link.stop()

    def serve_forever(self) -> None:
        """Run until SIGTERM/SIGINT, feeding the systemd watchdog meanwhile."""
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        self.start()
        sdnotify.notify("READY=1", f"STATUS=voice {self.settings.voice}, waiting for {self.topics.say}")
        interval = sdnotify.watchdog_interval()
        while not stop.wait(interval or 1.0):
            if interval and self.healthy():
                sdnotify.notify("WATCHDOG=1")
        self.shutdown()

    def healthy(self) -> bool:
        """The worker is alive and, if busy, has made progress recently."""
        if not self.worker.is_alive() or (self.wyoming is not None and not self.wyoming.alive()):
            return False
        stuck_after = self.config["watchdog"]["stuck_seconds"]
        return not self.busy or time.monotonic() - self.progress < stuck_after

    def _alive(self) -> None:
        self.progress = time.monotonic()

    # --- MQTT intake (network thread) ----------------------------------------------------

    def on_message(self, topic: str, payload: bytes) -> None:
        t = self.topics
        if topic == t.say:
            self.submit(payload, play=True)
        elif topic == t.prepare:
            self.submit(payload, play=False)
        elif topic == t.stop:
            self.stop_all()
        elif topic == t.ha_status:
            if payload.strip() == b"online":  # Home Assistant restarted: announce again
                self._publish_discovery()
        else:
            for name in SETTINGS:
                if topic == t.setting_set(name):
                    self.control.submit(self._apply_setting, name, payload)

    def submit(self, payload: bytes, play: bool = True) -> Job | None:
        try:
            job = self.parse_request(payload, play)
        except RequestError as e:
            self._error(str(e), e.request_id, e.text)
            return None
        if job.id in self.recent_ids:
            # answered, so an automation waiting for this id hears why nothing more comes
            log.info("ignoring message id %s: already received", job.id)
            self._event("duplicate", job)
            return None
        self.recent_ids[job.id] = None
        while len(self.recent_ids) > REMEMBERED_IDS:
            self.recent_ids.popitem(last=False)
        with self.cond:
            limit = self.config["queue"]["max_length"]
            if len(self.queue) >= limit and not job.interrupt:
                self._error(f"queue full ({limit} waiting); try again later", job.id, job.text)
                return None
            self._event("queued", job)
            if job.interrupt:
                self.queue.appendleft(job)
                self.cut.set()
            else:
                self.queue.append(job)
            self.cond.notify()
        return job

    def parse_request(self, payload: bytes, play: bool = True) -> Job:
        """A `say` payload (plain text or JSON) as a checked Job, or RequestError."""
        try:
            raw = payload.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError("payload is not valid UTF-8 text") from None
        if raw.lstrip().startswith(("{", "[")):
            job = self._parse_json(raw)
        else:
            job = Job(id=uuid.uuid4().hex[:12], text=raw)
        job.play = play
        text = job.text.strip()
        limit = self.config["queue"]["max_text_chars"]
        if not text:
            raise RequestError("empty text: nothing to speak", job.id, job.text)
        if len(job.text) > limit:
            raise RequestError(f"text too long ({len(job.text)} characters, limit {limit})",
                               job.id, job.text)
        if any(ord(c) < 32 and c not in "\t\n\r" for c in job.text):
            raise RequestError("text contains control characters", job.id, job.text)
        job.text = text
        return job

    def _parse_json(self, raw: str) -> Job:
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, RecursionError) as e:
            if raw.lstrip().startswith("["):  # "[お知らせ]…" is text, not broken JSON
                return Job(id=uuid.uuid4().hex[:12], text=raw)
            raise RequestError(f"invalid JSON: {getattr(e, 'msg', e)}") from None
        if not isinstance(data, dict):
            raise RequestError("JSON payload must be an object")
        rid = data.get("id")
        if rid is not None and (isinstance(rid, bool) or not isinstance(rid, (str, int))
                                or not 0 < len(str(rid)) <= MAX_ID_CHARS):
            raise RequestError(f"id must be a string or integer of at most {MAX_ID_CHARS} characters")
        rid = str(rid) if rid is not None else uuid.uuid4().hex[:12]
        text = data.get("text")
        quoted = text if isinstance(text, str) else None
        try:
            unknown = sorted(k for k in data if k not in REQUEST_FIELDS)
            if unknown:
                raise ValueError(f"unknown field {', '.join(map(repr, unknown))[:80]}; "
                                 f"known: {', '.join(REQUEST_FIELDS)}")
            if not isinstance(text, str):
                raise ValueError("'text' must be a string")
            job = Job(id=rid, text=text)
            if data.get("voice") is not None:
                voice = data["voice"]
                installed = self.store.voices()
                if not isinstance(voice, str) or voice not in installed:
                    raise ValueError(f"unknown voice {json.dumps(voice)[:60]}; installed: {', '.join(installed)}")
                job.voice = voice
            if data.get("style") is not None:
                styles = voice_styles(self.store.dir, job.voice or self.settings.voice)
                if not isinstance(data["style"], str) or data["style"] not in styles:
                    raise ValueError(f"unknown style {json.dumps(data['style'])[:60]}; "
                                     f"styles: {', '.join(styles)}")
                job.style = data["style"]
            if data.get("speed") is not None:
                job.speed = _number(data["speed"], "speed", *SPEED_RANGE)
            if data.get("volume") is not None:
                job.volume = _number(data["volume"], "volume", 0, 100) / 100
            if data.get("interrupt") is not None:
                if not isinstance(data["interrupt"], bool):
                    raise ValueError("interrupt must be true or false")
                job.interrupt = data["interrupt"]
        except ValueError as e:
            raise RequestError(str(e), rid, quoted) from None
        return job

    def stop_all(self) -> None:
        with self.cond:
            cancelled = list(self.queue)
            self.queue.clear()
            self.cut.set()
        for job in cancelled:
            self._error("cancelled: stop requested", job.id, job.text)
        log.info("stop: cut the current utterance, %d queued cancelled", len(cancelled))

    # --- settings (control thread) -------------------------------------------------------

    def _apply_setting(self, name: str, payload: bytes) -> None:
        s = self.settings
        try:
            value = payload.decode("utf-8").strip()
            if name == "volume":
                try:
                    number = float(value)
                except ValueError:
                    raise ValueError(f"volume must be a number from 0 to 100, got {value[:40]!r}") from None
                s.volume = _number(number, "volume", 0, 100) / 100
            elif name == "voice":
                installed = self.store.voices()
                if value not in installed:
                    raise ValueError(f"unknown voice {value[:60]!r}; installed: {', '.join(installed)}")
                self.store.voice(value)  # load now: a broken voice is refused here
                s.voice = value
                styles = voice_styles(self.store.dir, value)
                if s.style not in styles:
                    s.style = "Neutral" if "Neutral" in styles else styles[0]
            else:
                styles = voice_styles(self.store.dir, s.voice)
                if value not in styles:
                    raise ValueError(f"unknown style {value[:60]!r} for {s.voice}; styles: {', '.join(styles)}")
                s.style = value
        except (ValueError, ModelError) as e:
            self._error(f"{name} not changed: {e}")
        else:
            s.save()
            log.info("%s set to %s", name, s.state(name))
            if name == "voice":
                self._publish_discovery()  # the style list follows the voice
        self._publish_settings()  # on refusal too, so Home Assistant shows the real value

    # --- speaking (worker thread) --------------------------------------------------------

    def _work(self) -> None:
        while not self.shutting_down.is_set():
            with self.cond:
                while not self.queue and not self.shutting_down.is_set():
                    self.busy = False
                    self.cond.wait(timeout=1.0)
                if self.shutting_down.is_set():
                    return
                job = self.queue.popleft()
                self.cut.clear()
                self.busy, self.progress = True, time.monotonic()
            try:
                self._speak(job)
            except Exception as e:  # a bug must not end the worker
                log.exception("failed on %s", job.id)
                self._error(f"internal error: {type(e).__name__}: {e}", job.id, job.text)
            finally:
                with self.cond:
                    idle = not self.queue
                if idle:
                    self._publish_state("idle")

    def _speak(self, job: Job) -> None:
        s = self.settings
        voice_name = job.voice or s.voice
        try:
            voice = self.store.voice(voice_name)
        except (ModelError, ValueError) as e:
            self._error(f"voice {voice_name} cannot be used: {e}", job.id, job.text)
            return
        style = job.style or (s.style if s.style in voice.styles else next(iter(voice.styles)))
        speed = job.speed if job.speed is not None else self.config["voice"]["speed"]
        weight = self.config["voice"]["style_weight"]
        sr = voice.sample_rate
        key = cache_key(job.text, voice_name, style, weight, speed, voice_fingerprint(self.store, voice))
        cached = self.cache.get(key, sr)

        if job.play:
            self._publish_state("speaking")
        self._event("started", job)
        if cached is not None:
            ahead = SynthesisAhead.of_chunks([cached], sr)
        else:
            ahead = synthesize_ahead(self.engine, job.text, voice=voice_name, progress=self._alive,
                                     style=style, style_weight=weight, speed=speed)
        self.speaking = ahead
        try:
            if job.play:
                volume = job.volume if job.volume is not None else s.volume
                completed = self._play(job, ahead, sr, volume)
            else:
                completed = self._synthesize_only(ahead)
        except (TextError, ValueError) as e:
            self._error(f"cannot speak this text: {e}", job.id, job.text)
            return
        finally:
            ahead.cancel()  # a cut utterance stops synthesizing after the window in progress
        if completed is None:
            return  # audio failed for good; the error was published
        if completed and cached is None and ahead.complete:
            self.cache.put(key, sr, ahead.audio())
        seconds = round(ahead.audio().size / sr, 3)
        extra = {"cached": cached is not None, "seconds": seconds}
        if job.play:
            extra["underruns"] = self.player.underruns
        if not completed:
            extra["interrupted"] = True
        log.info("%s %s: %.1f s of audio%s", "spoke" if job.play else "prepared", job.id, seconds,
                 f", {self.player.underruns} underruns" if job.play else "")
        self._event("finished", job, **extra)

    def _synthesize_only(self, ahead: SynthesisAhead) -> bool:
        """Run synthesis to the end (for the cache); False if cut."""
        index = samples = 0
        while not self.cut.is_set():
            piece = ahead.get(index, timeout=0.1)
            if piece is None:
                if ahead.at_end(index):
                    return True
                continue
            index, samples = index + 1, samples + piece.audio.size
            ahead.played(samples)
        return False

    def _play(self, job: Job, ahead: SynthesisAhead, sr: int, volume: float) -> bool | None:
        """Play with retries when the device is missing or fails; None when it gave up.

        A retry starts the utterance over, from what was synthesized meanwhile.
        """
        for attempt in range(1, AUDIO_ATTEMPTS + 1):
            if attempt > 1:
                rescan_devices()  # a card plugged in (again) meanwhile is found
            try:
                return self.player.play(ahead, sr, volume, stop=self.cut, progress=self._alive)
            except AudioError as e:
                wait = self.config["audio"]["retry_seconds"]
                last = attempt == AUDIO_ATTEMPTS
                self._error(f"{e}" + ("" if last else f"; retrying in {wait:g} s"), job.id, job.text)
                if last or self.cut.wait(wait):
                    return None
        return None

    # --- publishing ----------------------------------------------------------------------

    def _on_connected(self) -> None:
        self.link.publish(self.topics.status, "online", retain=True)
        self._publish_state("speaking" if self.busy else "idle")
        self._publish_settings()
        self._publish_discovery()

    def _publish_settings(self) -> None:
        for name in SETTINGS:
            self.link.publish(self.topics.setting(name), self.settings.state(name), retain=True)

    def _publish_state(self, state: str) -> None:
        self.link.publish(self.topics.state, state, retain=True)

    def _publish_discovery(self) -> None:
        styles = voice_styles(self.store.dir, self.settings.voice)
        for topic, config in discovery_messages(self.topics, self.config["mqtt"]["client_id"],
                                                self.store.voices(), styles):
            self.link.publish(topic, config, retain=True)

    def _event(self, event: str, job: Job, **extra) -> None:
        payload = {"event": event, "id": job.id, "text": job.text[:EVENT_TEXT_CHARS], **extra}
        if not job.play:
            payload["prepare"] = True
        self.link.publish(self.topics.event, payload)

    def _error(self, reason: str, request_id: str | None = None, text: str | None = None) -> None:
        log.warning("error%s: %s", f" ({request_id})" if request_id else "", reason)
        self.link.publish(self.topics.event, {
            "event": "error", "id": request_id,
            "text": text[:EVENT_TEXT_CHARS] if isinstance(text, str) else None, "error": reason,
        })


def run(config: dict) -> int:
    """`hayakoe-pi run`: load everything, then serve until stopped."""
    from .config import check_models

    os.umask(0o077)  # cache, split models and state are the service's alone, under systemd or not
    check_models(config)
    sdnotify.notify("STATUS=loading models")
    started = time.monotonic()
    daemon = Daemon(config)
    log.info("models loaded in %.1f s: voice %s, %d voices installed", time.monotonic() - started,
             daemon.settings.voice, len(daemon.store.voices()))
    try:
        log.info("audio device: %s", check_device(config["audio"]["device"]))
    except AudioError as e:
        log.error("%s; speech will fail until it is fixed", e)
    daemon.serve_forever()
    # Skip interpreter teardown: a synthesis or Wyoming thread still inside ONNX
    # Runtime when its globals are destroyed aborts the process (seen: SIGABRT).
    logging.shutdown()
    os._exit(0)

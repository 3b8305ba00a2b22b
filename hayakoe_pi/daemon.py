"""The appliance: MQTT requests in, speech out of the sound card.

Threads (ARCHITECTURE.md has them all):
- paho's network threads: the intake parses each say/prepare and queues it,
  the control connection hands commands on (neither ever blocks);
- one worker speaks the queue in order, playing while a synthesis thread of
  the utterance runs ahead of it (ahead.py); a request is acknowledged to the
  broker with its last event;
- one control thread applies voice/style/volume and dictionary changes (a
  voice may take seconds to load, the words a second to compile);
- the main thread waits for SIGTERM/SIGHUP and pings the systemd watchdog
  while the worker makes progress.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import sdnotify
from .ahead import SynthesisAhead
from .audio import AudioError, Player, check_device, rescan_devices
from .cache import PhraseCache
from .config import Config
from .engine import TextError
from .models.store import ModelStore
from .mqtt import SELECTION, BrokerLink, Topics, discovery_messages
from .mqtt_api import PayloadError, SayRequest, error_event, event, parse_say, parse_volume, parse_word
from .speaking import SpeakingFile
from .speech import SavedSelection, SpeechError, SpeechService
from .text.dictionary import UserDictionary
from .threads import name_os_thread

log = logging.getLogger("hayakoe_pi")

REMEMBERED_IDS = 1000  # ids seen recently, to drop messages the broker delivers twice
AUDIO_ATTEMPTS = 3


class Daemon:
    """MQTT's front door: the queue of say requests, the speaker thread, commands and events."""

    def __init__(self, config: Config, store: ModelStore | None = None):
        self.config = config
        models_dir = Path(config.models.dir).expanduser()
        self.store = store or ModelStore(models_dir, derived_dir=config.cache.models_dir)
        voice_cfg = config.voice
        selection = SavedSelection(Path(config.state.file), config.audio.volume,
                                   voice_cfg.name, voice_cfg.style)
        self.speech = SpeechService(self.store, PhraseCache(config.cache.dir, config.cache.max_mb),
                                    selection, voice_cfg.name, voice_cfg.style, voice_cfg.speed,
                                    voice_cfg.style_weight, config.queue.max_text_chars,
                                    UserDictionary(Path(config.dictionary.file)), config.cache.dictionary_dir)
        self._reload_dictionary(announce=False)
        self.player = Player(config.audio.device)
        self.topics = Topics(config.mqtt.topic_prefix, config.mqtt.discovery_prefix, config.mqtt.birth_topic)
        self.link = BrokerLink(config.mqtt, self.topics, self.on_command, self.on_request, self._on_connected)
        # the request being spoken, on disk: after a crash the next start tells Home Assistant
        self.speaking_file = SpeakingFile(Path(config.state.file).with_name("speaking.json"))
        self.interrupted = self.speaking_file.take()

        self.queue: deque[SayRequest] = deque()
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
        if config.wyoming.enabled:
            from .wyoming import WyomingServer

            self.wyoming = WyomingServer(config.wyoming, self.speech)

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
        # after a hand edit of the dictionary file (systemctl reload)
        signal.signal(signal.SIGHUP, lambda *_: self.control.submit(self._reload_dictionary))
        self.start()
        sdnotify.notify("READY=1", f"STATUS=voice {self.speech.current_voice()}, waiting for {self.topics.say}")
        interval = sdnotify.watchdog_interval()
        while not stop.wait(interval or 1.0):
            if interval and self.healthy():
                sdnotify.notify("WATCHDOG=1")
        self.shutdown()

    def healthy(self) -> bool:
        """The worker is alive and, if busy, has made progress recently."""
        if not self.worker.is_alive() or (self.wyoming is not None and not self.wyoming.alive()):
            return False
        stuck_after = self.config.watchdog.stuck_seconds
        return not self.busy or time.monotonic() - self.progress < stuck_after

    def _note_progress(self) -> None:
        self.progress = time.monotonic()

    # --- MQTT intake (network threads) ---------------------------------------------------

    def on_command(self, topic: str, payload: bytes) -> None:
        t = self.topics
        if topic == t.stop:
            self.stop_all()
        elif topic in (t.dictionary_add, t.dictionary_remove):
            self.control.submit(self._change_dictionary, topic == t.dictionary_add, payload)
        elif topic == t.ha_status:
            if payload.strip() == b"online":  # Home Assistant restarted: announce again
                self._publish_discovery()
        else:
            for name in SELECTION:
                if topic == t.setting_set(name):
                    self.control.submit(self._change_selection, name, payload)

    def on_request(self, topic: str, payload: bytes, ack=None) -> None:
        """A say or prepare message; `ack()` once it has its last event (the broker keeps it until then)."""
        self.submit(payload, play=topic == self.topics.say, ack=ack or (lambda: None))

    def submit(self, payload: bytes, play: bool = True, ack=lambda: None) -> SayRequest | None:
        try:
            request = parse_say(payload, self.speech, play)
        except PayloadError as e:
            self._error(str(e), e.request_id, e.text)
            ack()
            return None
        request.ack = ack
        if request.id in self.recent_ids:
            # answered, so an automation waiting for this id hears why nothing more comes
            log.info("ignoring message id %s: already received", request.id)
            self._final("duplicate", request)
            return None
        self.recent_ids[request.id] = None
        while len(self.recent_ids) > REMEMBERED_IDS:
            self.recent_ids.popitem(last=False)
        with self.cond:
            limit = self.config.queue.max_length
            if len(self.queue) >= limit and not request.interrupt:
                self._final_error(f"queue full ({limit} waiting); try again later", request)
                return None
            self._event("queued", request)
            if request.interrupt:
                self.queue.appendleft(request)
                self.cut.set()
            else:
                self.queue.append(request)
            self.cond.notify()
        return request

    def stop_all(self) -> None:
        with self.cond:
            cancelled = list(self.queue)
            self.queue.clear()
            self.cut.set()
        for request in cancelled:
            self._final_error("cancelled: stop requested", request)
        log.info("stop: cut the current utterance, %d queued cancelled", len(cancelled))

    # --- voice, style, volume (control thread) -------------------------------------------------------

    def _change_selection(self, name: str, payload: bytes) -> None:
        try:
            if name == "volume":
                self.speech.set_volume(parse_volume(payload))
            else:
                value = payload.decode("utf-8", errors="replace").strip()
                (self.speech.set_voice if name == "voice" else self.speech.set_style)(value)
        except ValueError as e:  # SpeechError too
            self._error(f"{name} not changed: {e}")
        else:
            log.info("%s set to %s", name, self.speech.shown(name))
            if name == "voice":
                self._publish_discovery()  # the style list follows the voice
        self._publish_selection()  # on refusal too, so Home Assistant shows the real value

    # --- the user dictionary (control thread) --------------------------------------------

    def _change_dictionary(self, adding: bool, payload: bytes) -> None:
        try:
            data = parse_word(payload, adding)
            entry = self.speech.add_word(data) if adding else self.speech.remove_word(data.get("surface"))
        except (ValueError, RuntimeError, OSError) as e:
            self._error(f"dictionary not changed: {e}")
            return
        log.info("dictionary: %s %s (%s, accent %d)", "added" if adding else "removed", entry.surface,
                 entry.reading, entry.accent)
        self.link.publish(self.topics.event, {"event": "dictionary", "action": "added" if adding else "removed",
                                              **dataclasses.asdict(entry)})

    def _reload_dictionary(self, announce: bool = True) -> None:
        try:
            problems = self.speech.reload_dictionary()
        except (RuntimeError, OSError) as e:
            log.error("the user dictionary cannot be used (%s); speaking without it", e)
            problems = [str(e)]
        words = len(self.speech.dictionary.entries)
        log.info("dictionary: %d words from %s", words, self.speech.dictionary.path)
        if announce:
            self.link.publish(self.topics.event, {"event": "dictionary", "action": "reloaded", "words": words,
                                                  "problems": problems})

    # --- speaking (worker thread) --------------------------------------------------------

    def _work(self) -> None:
        name_os_thread("speaker")
        while not self.shutting_down.is_set():
            with self.cond:
                while not self.queue and not self.shutting_down.is_set():
                    self.busy = False
                    self.cond.wait(timeout=1.0)
                if self.shutting_down.is_set():
                    return
                request = self.queue.popleft()
                self.cut.clear()
                self.busy, self.progress = True, time.monotonic()
            self.speaking_file.write(request)
            try:
                self._speak(request)
            except Exception as e:  # a bug must not end the worker
                log.exception("failed on %s", request.id)
                self._final_error(f"internal error: {type(e).__name__}: {e}", request)
            finally:
                if not self.shutting_down.is_set():
                    self.speaking_file.clear()
                with self.cond:
                    idle = not self.queue
                if idle:
                    self._publish_state("idle")

    def _speak(self, request: SayRequest) -> None:
        try:
            choice = self.speech.choose(request.voice, request.style)
        except SpeechError as e:
            self._final_error(str(e), request)
            return
        utterance = self.speech.utterance(request.text, choice, request.speed, progress=self._note_progress)
        if request.play:
            self._publish_state("speaking")
        self._event("started", request)
        ahead = self.speaking = utterance.ahead
        completed = False
        try:
            if request.play:
                volume = request.volume if request.volume is not None else self.speech.current_volume()
                completed = self._play(request, ahead, choice.sample_rate, volume)
            else:
                completed = self._synthesize_only(ahead)
        except (TextError, ValueError) as e:
            self._final_error(f"cannot speak this text: {e}", request)
            return
        finally:
            utterance.close(bool(completed))
        if not completed and self.shutting_down.is_set():
            # not acknowledged: the broker hands it to the next start, which speaks it from the start
            log.info("%s cut by the shutdown; it is spoken again after the restart", request.id)
            return
        if completed is None:
            return  # audio failed for good; the error was published
        seconds = round(ahead.audio().size / choice.sample_rate, 3)
        extra = {"cached": utterance.cached, "seconds": seconds}
        if request.play:
            extra["underruns"] = self.player.underruns
        if not completed:
            extra["interrupted"] = True
        log.info("%s %s: %.1f s of audio%s", "spoke" if request.play else "prepared", request.id, seconds,
                 f", {self.player.underruns} underruns" if request.play else "")
        self._final("finished", request, **extra)

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

    def _play(self, request: SayRequest, ahead: SynthesisAhead, sr: int, volume: float) -> bool | None:
        """Play with retries when the device is missing or fails; None when it gave up.

        A retry starts the utterance over, from what was synthesized meanwhile.
        """
        for attempt in range(1, AUDIO_ATTEMPTS + 1):
            if attempt > 1:
                rescan_devices()  # a card plugged in (again) meanwhile is found
            try:
                return self.player.play(ahead, sr, volume, stop=self.cut, progress=self._note_progress)
            except AudioError as e:
                wait = self.config.audio.retry_seconds
                if attempt == AUDIO_ATTEMPTS:
                    self._final_error(str(e), request)
                    return None
                self._error(f"{e}; retrying in {wait:g} s", request.id, request.text)
                if self.cut.wait(wait):
                    return None
        return None

    # --- publishing ----------------------------------------------------------------------

    def _on_connected(self) -> None:
        self.link.publish(self.topics.status, "online", retain=True)
        if self.interrupted is not None:  # the last run died while speaking this
            log.warning("the last run was cut while speaking %s", self.interrupted["id"])
            self.link.publish(self.topics.event, {"event": "interrupted", **self.interrupted})
            self.interrupted = None
        self._publish_state("speaking" if self.busy else "idle")
        self._publish_selection()
        self._publish_discovery()

    def _publish_selection(self) -> None:
        for name in SELECTION:
            self.link.publish(self.topics.setting(name), self.speech.shown(name), retain=True)

    def _publish_state(self, state: str) -> None:
        self.link.publish(self.topics.state, state, retain=True)

    def _publish_discovery(self) -> None:
        styles = self.speech.styles(self.speech.current_voice())
        for topic, config in discovery_messages(self.topics, self.config.mqtt.client_id,
                                                self.speech.voices(), styles):
            self.link.publish(topic, config, retain=True)

    def _event(self, kind: str, request: SayRequest, **extra) -> None:
        self.link.publish(self.topics.event, event(kind, request, **extra))

    def _final(self, kind: str, request: SayRequest, **extra) -> None:
        """The request's last event: now the broker may forget the message."""
        self._event(kind, request, **extra)
        request.ack()

    def _final_error(self, reason: str, request: SayRequest) -> None:
        self._error(reason, request.id, request.text)
        request.ack()

    def _error(self, reason: str, request_id: str | None = None, text: str | None = None) -> None:
        log.warning("error%s: %s", f" ({request_id})" if request_id else "", reason)
        self.link.publish(self.topics.event, error_event(reason, request_id, text))


def run(config: Config) -> int:
    """`hayakoe-pi run`: load everything, then serve until stopped."""
    from .config import check_models

    os.umask(0o077)  # cache, split models and state are the service's alone, under systemd or not
    check_models(config)
    sdnotify.notify("STATUS=loading models")
    started = time.monotonic()
    daemon = Daemon(config)
    log.info("models loaded in %.1f s: voice %s, %d voices installed", time.monotonic() - started,
             daemon.speech.current_voice(), len(daemon.store.voices()))
    try:
        log.info("audio device: %s", check_device(config.audio.device))
    except AudioError as e:
        log.error("%s; speech will fail until it is fixed", e)
    daemon.serve_forever()
    # Skip interpreter teardown: a synthesis or Wyoming thread still inside ONNX
    # Runtime when its globals are destroyed aborts the process (seen: SIGABRT).
    logging.shutdown()
    os._exit(0)

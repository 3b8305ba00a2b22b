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

import logging
import os
import signal
import threading
import time
from collections import deque
from pathlib import Path

from . import sdnotify
from .admission import Admission
from .intake import Intake
from ..settings.announcements import AnnouncementSettings, playing_volume
from ..synthesis.ahead import SynthesisAhead
from ..sound.player import AudioError, Player, check_device, rescan_devices
from ..speech.cache import PhraseCache
from ..sound.chime import Chimes
from .commands import Commands
from ..settings.config import Config
from .diskspace import DiskWatch, service_folders
from ..synthesis.engine import TextError
from ..models.store import ModelStore
from .progress import PrepareSteps
from ..broker.link import BrokerLink
from ..broker.payloads import SayRequest, event
from .receipts import Receipts
from .reports import Reports
from .speaking import SpeakingRecord, died_speaking
from ..settings.runtime import config_changed_at
from ..speech.service import SavedSelection, SpeechError, SpeechService
from ..broker.topics import ANNOUNCEMENT, SELECTION, Topics
from ..text.dictionary import UserDictionary
from ..threads import name_os_thread

log = logging.getLogger("hayakoe_pi")

AUDIO_ATTEMPTS = 3


class Daemon:
    """MQTT's front door: the queue of say requests, the speaker thread, commands and events."""

    def __init__(self, config: Config, store: ModelStore | None = None, config_file: str | Path | None = None):
        self.config = config
        models_dir = Path(config.models.dir).expanduser()
        self.preparing = PrepareSteps()
        self.store = store or ModelStore(models_dir, derived_dir=config.cache.models_dir,
                                         decoder=config.engine.decoder, progress=self.preparing)
        voice_cfg, state = config.voice, Path(config.state.file)
        config_mtime = config_changed_at(config_file)
        selection = SavedSelection(state, config.audio.volume, voice_cfg.name, voice_cfg.style, config_mtime)
        words = UserDictionary(Path(config.dictionary.file), config.dictionary.max_entries)
        self.speech = SpeechService(self.store, PhraseCache(config.cache.dir, config.cache.max_mb),
                                    selection, voice_cfg.name, voice_cfg.style, voice_cfg.speed,
                                    voice_cfg.style_weight, config.queue.max_text_chars, words,
                                    config.cache.dictionary_dir)
        audio = config.audio
        self.player = Player.for_config(audio)
        self.chimes = Chimes(audio.chime, audio.chime_dir)
        self.announcements = AnnouncementSettings(state.with_name("announcements.json"), audio.chime, audio.quiet(),
                                                  config_mtime)
        log.info("settings: %s, %s", selection.describe(), self.announcements.describe())
        self.identity = config.identity()
        mqtt = config.mqtt
        self.topics = Topics(mqtt.topic_prefix, self.identity.id, mqtt.discovery_prefix, mqtt.birth_topic)
        self.link = BrokerLink(mqtt, self.identity.client_id, self.topics, self.on_command, self.on_request,
                               self._on_connected)
        self.reports = Reports(self.link, self.topics, self.identity, self.speech, self.announcements,
                               DiskWatch(service_folders(config.cache.dir, state)))
        self.commands = Commands(self.speech, self.reports)
        self.commands.reload_dictionary(announce=False)
        # the request being spoken, on disk: after a crash the next start tells Home Assistant,
        # and a message that keeps killing the daemon is found out
        self.speaking_record = SpeakingRecord(state.with_name("speaking.json"))
        self.interrupted = self.speaking_record.take()
        deaths = dict([died_speaking(self.interrupted)]) if self.interrupted else {}
        self.admission = Admission(config.queue.duplicate_window_s, config.queue.max_age_s,
                                   Receipts(state.with_name("received.json")), deaths)

        self.queue: deque[SayRequest] = deque()
        self.cond = threading.Condition()
        self.cut = threading.Event()  # stop the utterance being played
        self.shutting_down = threading.Event()
        self.progress = time.monotonic()  # last sign of life from the worker
        self.busy = False
        self.speaking: SynthesisAhead | None = None  # the utterance in progress
        self.worker = threading.Thread(target=self._work, name="speaker", daemon=True)
        self.intake = Intake(self.speech, self.chimes.resolve, self.admission, self.reports, self.queue, self.cond,
                             self.cut, config.queue.max_length)
        self.wyoming = None  # the Wyoming server for Home Assistant Assist, when enabled
        if config.wyoming.enabled:
            from ..wyoming import WyomingServer

            self.wyoming = WyomingServer(config.wyoming, self.speech, self.identity)

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self.interrupted is not None:  # the last run died while speaking this
            # queued before anything can be spoken: the first publish once connected, so a run that
            # dies again at once (the same message) has still told of the last death
            log.warning("the last run was cut while speaking %r", self.interrupted["id"])
            self.reports.event({"event": "interrupted", **self.interrupted})
            self.interrupted = None
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
        self.player.close()
        self.speaking_record.mark_clean()  # what it was speaking (if anything) did not kill it
        if self.speaking is not None:  # let the decoder window in progress end
            self.speaking.join(timeout=2.0)
        self.commands.stop()
        if self.wyoming is not None:
            self.wyoming.stop(timeout=2.0)
        self.link.stop()

    def serve_forever(self) -> None:
        """Run until SIGTERM/SIGINT, feeding the systemd watchdog meanwhile."""
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        # after a hand edit of the dictionary file (systemctl reload)
        signal.signal(signal.SIGHUP, lambda *_: self.commands.queue_reload())
        self.start()
        sdnotify.notify("READY=1", f"STATUS=voice {self.speech.current_voice()}, waiting for {self.topics.say}")
        interval = sdnotify.watchdog_interval()
        while not stop.wait(interval or 1.0):
            if interval and self.healthy():
                sdnotify.notify("WATCHDOG=1")
            self.reports.disk_space()
        self.shutdown()

    def healthy(self) -> bool:
        """The worker is alive and, if busy, has made progress recently."""
        if not self.worker.is_alive() or (self.wyoming is not None and not self.wyoming.alive()):
            return False
        stuck_after = self.config.watchdog.stuck_seconds  # a voice prepared on first use is not stuck
        return not self.busy or self.preparing.running() or time.monotonic() - self.progress < stuck_after

    def _note_progress(self) -> None:
        self.progress = time.monotonic()

    # --- MQTT intake (network threads) ---------------------------------------------------

    def on_command(self, topic: str, payload: bytes) -> None:
        t = self.topics
        if topic in (t.stop, t.room_stop):
            self.stop_all()
        elif topic in (t.dictionary_add, t.dictionary_remove):
            self.commands.queue_dictionary_change(topic == t.dictionary_add, payload)
        elif topic == t.ha_status:
            if payload.strip() == b"online":  # Home Assistant restarted: announce again
                self.reports.discovery()
        else:
            for name in SELECTION + ANNOUNCEMENT:
                if topic == t.setting_set(name):
                    self.commands.queue_setting(name, payload)

    def on_request(self, topic: str, payload: bytes, ack=None, packet_id: int = 0, redelivered: bool = False) -> None:
        """A say or prepare message; `ack()` once it has its last event (the broker keeps it until then)."""
        self.intake.submit(payload, play=topic in (self.topics.say, self.topics.room_say), ack=ack or (lambda: None),
                           packet_id=packet_id, redelivered=redelivered)

    def stop_all(self) -> None:
        with self.cond:
            cancelled = list(self.queue)
            self.queue.clear()
            self.cut.set()
        for request in cancelled:
            self._final_error("cancelled: stop requested", request, "cancelled")
        log.info("stop: cut the current utterance, %d queued cancelled", len(cancelled))

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
            try:
                if too_old := self.admission.age_over_limit(request):
                    log.info("not speaking %r: %.0f s old (limit %.0f s)", request.id, *too_old)
                    self._final("expired", request, age_s=round(too_old[0], 1), max_age_s=too_old[1])
                else:
                    self.speaking_record.write(request, self.admission.deaths.get(request.digest, 0))
                    self._speak(request)
            except Exception as e:  # a bug must not end the worker
                log.exception("failed on %r", request.id)
                self._final_error(f"internal error: {type(e).__name__}: {e}", request, "internal")
            finally:  # `idle` once none waits, however it ended (finished, expired, an error, cut by stop)
                if not self.shutting_down.is_set():
                    self.speaking_record.clear()
                with self.cond:
                    idle = not self.queue
                if idle:
                    self.reports.state("idle")

    def _speak(self, request: SayRequest) -> None:
        try:
            choice = self.speech.choose(request.voice, request.style)
        except SpeechError as e:
            self._final_error(str(e), request, e.code.replace("-", "_"))
            return
        utterance = self.speech.utterance(request.text, choice, request.speed, progress=self._note_progress)
        sound, chime, volume = {}, None, 1.0  # how it is heard: with a chime, quieted by quiet hours
        if request.play:
            self.reports.state("speaking")
            volume, quieted = playing_volume(self.speech.current_volume() if request.volume is None
                                             else request.volume, self.announcements.quiet, request.alert)
            chime = self._chime(request, choice.sample_rate)
            sound = {key: True for key, on in (("chime", chime is not None), ("quiet_hours", quieted)) if on}
        if request.at is None or not request.play:
            self._event("started", request, **sound)
        ahead = self.speaking = utterance.ahead
        completed = False
        try:
            if request.play:
                completed = self._play(request, ahead, choice.sample_rate, volume, chime, sound)
            else:
                completed = self._synthesize_only(ahead)
        except (TextError, ValueError) as e:
            self._final_error(f"cannot speak this text: {e}", request, "cannot_speak")
            return
        finally:
            utterance.close(bool(completed))
        if not completed and self.shutting_down.is_set():
            # not acknowledged: the broker hands it to the next start, which speaks it from the start
            log.info("%r cut by the shutdown; it is spoken again after the restart", request.id)
            return
        if completed is None:
            return  # audio failed for good; the error was published
        seconds = round(ahead.audio().size / choice.sample_rate, 3)
        extra = {"cached": utterance.cached, "seconds": seconds}
        if request.play:
            extra["underruns"] = self.player.underruns
        if not completed:
            extra["interrupted"] = True
        log.info("%s %r: %.1f s of audio%s", "spoke" if request.play else "prepared", request.id, seconds,
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

    def _chime(self, request: SayRequest, sample_rate: int):
        """The chime's samples before this message (None: none); a WAV gone unreadable is left out."""
        try:
            return self.chimes.audio(self.announcements.chime_for(request.chime), sample_rate)
        except ValueError as e:
            log.warning("no chime for %r: %s", request.id, e)
            return None

    def _play(self, request: SayRequest, ahead: SynthesisAhead, sr: int, volume: float, chime, sound) -> bool | None:
        """Play with retries when the device is missing or fails; None when it gave up.

        A retry starts the utterance over, from what was synthesized meanwhile.
        """
        starts = []  # with "at", `started` comes when the card opens, saying how late it is

        def started(late: float) -> None:
            if request.at is not None and not starts:
                starts.append(late)
                self._event("started", request, at=request.at, **({"late_s": round(late, 3)} if late else {}),
                            **sound)

        for attempt in range(1, AUDIO_ATTEMPTS + 1):
            if attempt > 1:
                rescan_devices()  # a card plugged in (again) meanwhile is found
            try:
                return self.player.play(ahead, sr, volume, stop=self.cut, progress=self._note_progress,
                                        start_at=request.at_steady, on_start=started, prelude=chime)
            except AudioError as e:
                wait = self.config.audio.retry_seconds
                if attempt == AUDIO_ATTEMPTS:
                    self._final_error(str(e), request, "audio")
                    return None
                self.reports.error(f"{e}; retrying in {wait:g} s", request.id, request.text, "audio")
                if self.cut.wait(wait):
                    return None
        return None

    # --- publishing ----------------------------------------------------------------------

    def _on_connected(self) -> None:
        self.reports.online(self.busy)
        self.admission.receipts.intake_subscribed()  # the broker has handed back what it held

    def _event(self, kind: str, request: SayRequest, **extra) -> None:
        self.reports.event(event(kind, request, **extra))

    def _final(self, kind: str, request: SayRequest, **extra) -> None:
        """The request's last event: now the broker may forget the message."""
        self._event(kind, request, **extra)
        self.admission.answered(request)
        request.ack()

    def _final_error(self, reason: str, request: SayRequest, code: str) -> None:
        self.reports.error(reason, request.id, request.text, code)
        self.admission.answered(request)
        request.ack()


def run(config: Config, config_file: str | Path | None = None) -> int:
    """`hayakoe-pi run`: load everything, then serve until stopped."""
    from ..settings.config import check_models

    os.umask(0o077)  # cache, split models and state are the service's alone, under systemd or not
    check_models(config)
    sdnotify.notify("STATUS=loading models")
    started = time.monotonic()
    daemon = Daemon(config, config_file=config_file)
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

"""The Wyoming TCP server: its thread, asyncio loop and listening socket, and its Info."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from wyoming.info import Attribution, Info, TtsProgram, TtsVoice, TtsVoiceSpeaker
from wyoming.server import AsyncTcpServer

from .. import __version__
from ..settings.config import Config, Identity, WyomingConfig
from ..speech.service import SpeechService
from .announce import LANGUAGES, PROGRAM, announce, device_instance_name
from .handler import Handler
from .limits import Connections

log = logging.getLogger("hayakoe_pi.wyoming")

SYNTH_THREADS = 4  # blocking calls (cache, voice loading) at once; syntheses take turns in the engine anyway
BIND_RETRY_SECONDS = 5.0
_PROGRAM_ATTRIBUTION = ("hayakoe-pi", "")
_VOICE_ATTRIBUTION = ("HayaKoe / Style-Bert-VITS2 JP-Extra", "https://huggingface.co/lemondouble/hayakoe")


def build_info(speech: SpeechService, identity: Identity) -> Info:
    """The installed voices, their styles as speakers; the program named after the Pi, which
    Home Assistant shows as the engine's name."""
    voices = []
    for name in speech.voices():
        styles = speech.styles(name)
        if not styles:
            log.warning("wyoming: voice %s has no readable styles; not listed", name)
            continue
        voices.append(TtsVoice(
            name=name, description=name, attribution=Attribution(*_VOICE_ATTRIBUTION),
            installed=True, version=None, languages=list(LANGUAGES),
            speakers=[TtsVoiceSpeaker(name=s) for s in styles],
        ))
    program = TtsProgram(
        name=PROGRAM if identity.legacy else f"HayaKoe {identity.name}", description="HayaKoe Pi: offline Japanese text to speech (Style-Bert-VITS2 JP-Extra)",
        attribution=Attribution(*_PROGRAM_ATTRIBUTION), installed=True, version=__version__,
        voices=voices, supports_synthesize_streaming=True,
    )
    return Info(tts=[program])


class WyomingServer:
    """Serves `speech` over Wyoming (config section `wyoming`), in its own thread and asyncio loop."""

    def __init__(self, config: WyomingConfig, speech: SpeechService, identity: Identity | None = None):
        self.config = config
        self.speech = speech
        self.identity = identity or Config().identity()
        self.pool = ThreadPoolExecutor(max_workers=SYNTH_THREADS, thread_name_prefix="wyoming-synth")
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listening = threading.Event()
        self._stop: asyncio.Event | None = None
        self._stop_requested = threading.Event()
        self.connections = Connections(config.max_syntheses, config.write_timeout_s, config.idle_timeout_s)
        self._thread = threading.Thread(target=self._run, name="wyoming", daemon=True)

    # lifecycle (called from the daemon's threads)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop_requested.set()
        loop, stop = self.loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # loop already closed
                pass
        self._thread.join(timeout)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def alive(self) -> bool:
        return self._thread.is_alive() or self._stop_requested.is_set()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("wyoming: server thread failed")

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stop_requested.is_set():
            return
        host, port = self.config.host, self.config.port
        server = AsyncTcpServer(host, port)
        make_handler = partial(Handler, speech=self.speech, pool=self.pool, connections=self.connections,
                               describe=partial(build_info, self.speech, self.identity))
        while True:
            try:
                await server.start(make_handler)
                break
            except OSError as e:
                log.error("wyoming: cannot listen on %s:%d (%s); retrying in %g s",
                          host, port, e.strerror or e, BIND_RETRY_SECONDS)
                try:
                    await asyncio.wait_for(self._stop.wait(), BIND_RETRY_SECONDS)
                    return
                except asyncio.TimeoutError:
                    continue
        self.listening.set()
        log.info("wyoming: serving on %s:%d", host, port)
        announcing = asyncio.create_task(announce(host, port, device_instance_name(self.identity))) if self.config.zeroconf else None
        try:
            await self._stop.wait()
        finally:
            log.info("wyoming: stopping")
            if announcing is not None:
                announcing.cancel()
                try:
                    await announcing
                except (asyncio.CancelledError, Exception):
                    pass
            try:
                await server.stop()
            except Exception as e:
                log.warning("wyoming: error while stopping: %s", e)

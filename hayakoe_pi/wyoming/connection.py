"""One Wyoming connection's life under the server's limits (limits.py): admitted or refused
with `busy` at once, closed after `idle_timeout` without a request (pings do not count), each
write timed (a client that keeps the server waiting is dropped), a refused request answered with
an error before closing. Its requests are the handler's (handler.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.ping import Ping
from wyoming.server import AsyncEventHandler

from .events import RequestError, read_event
from .limits import Connections, NotReading

log = logging.getLogger("hayakoe_pi.wyoming")

DRAIN_BEFORE_CLOSE_SECONDS = 2.0
SEND_BUFFER_BYTES = 64 * 1024  # per client in the kernel (and as much in the transport): audio waiting to be read


class Connection(AsyncEventHandler):
    """One client connection; `handle_event` answers its events."""

    def __init__(self, reader, writer, connections: Connections):
        super().__init__(reader, writer)
        self.connections = connections
        peer = writer.get_extra_info("peername")
        self.host = str(peer[0]) if isinstance(peer, tuple) else str(peer)  # what the limit per address counts
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        sock = writer.get_extra_info("socket")
        if sock is not None:  # a client that stops reading holds little, and is found out soon
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)

    def _abandon_stream(self) -> None:
        """Stop what a request left running (the handler's streamed synthesis)."""

    def _waited(self, seconds: float) -> None:
        """The client kept a write waiting this long (the handler counts it against the request)."""

    async def run(self) -> None:
        log.debug("wyoming: %s connected", self.peer)
        refusal = self.connections.admit(self.host)
        if refusal is not None:
            # at once: a burst held open here would use up the daemon's file descriptors
            try:
                await self.write_event(Error(text=refusal, code="busy").event())
            except (ConnectionError, OSError):
                pass
            self.writer.close()
            return
        idle_timeout = self.connections.idle_timeout
        idle_until = time.monotonic() + idle_timeout
        try:
            while True:
                try:
                    try:
                        event = await asyncio.wait_for(read_event(self.reader), idle_until - time.monotonic())
                    except asyncio.TimeoutError:
                        log.info("wyoming: %s sent no request for %g s (pings do not count): disconnected",
                                 self.peer, idle_timeout)
                        break
                    if event is None or not await self.handle_event(event):
                        break
                    if not Ping.is_type(event.type):  # a ping alone must not hold a connection forever
                        idle_until = time.monotonic() + idle_timeout
                except RequestError as e:
                    log.warning("wyoming: %s: %s", self.peer, e)
                    self._abandon_stream()
                    await self._close_with_error(str(e), e.code)
                    return
        except NotReading as e:
            log.warning("wyoming: %s %s: disconnected", self.peer, e)
        except (ConnectionError, OSError) as e:
            log.warning("wyoming: %s went away: %s", self.peer, e.strerror or type(e).__name__)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug must not end the server
            log.exception("wyoming: internal error with %s", self.peer)
            self._abandon_stream()
            await self._close_with_error(f"internal error: {type(e).__name__}: {e}", "internal-error")
        finally:
            self.connections.leave(self.host)
            self._abandon_stream()
            self.writer.close()
            log.debug("wyoming: %s disconnected", self.peer)

    async def write_event(self, event: Event) -> None:
        """Send an event; a client that has not read for `write_timeout` seconds, or takes a
        request's audio too slowly (limits.ReadPace), is dropped (NotReading): it cannot hold its connection."""
        started = time.monotonic()
        try:
            await asyncio.wait_for(async_write_event(event, self.writer), self.connections.write_timeout)
            self._waited(time.monotonic() - started)
        except asyncio.TimeoutError:
            self.writer.transport.abort()
            raise NotReading(f"stopped reading for {self.connections.write_timeout:g} s") from None
        except NotReading:
            self.writer.transport.abort()
            raise

    async def _close_with_error(self, text: str, code: str) -> None:
        """Send an error, say nothing more is coming, and let the client read it before closing."""
        try:
            await self.write_event(Error(text=text, code=code).event())
            if self.writer.can_write_eof():
                self.writer.write_eof()
            # read what the client still sends, so closing does not reset the connection
            # (which could discard the error before the client reads it)
            deadline = time.monotonic() + DRAIN_BEFORE_CLOSE_SECONDS
            while (left := deadline - time.monotonic()) > 0:
                if not await asyncio.wait_for(self.reader.read(65536), left):
                    break
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass

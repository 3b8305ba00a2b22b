"""One Wyoming connection's life under the server's limits (limits.py): admitted or refused
with `busy` at once, closed after `idle_timeout` without a request (only requests that do work
count: not pings, not unknown events), or to make room for another address (with `busy`), each
write timed (a client that keeps the server waiting is dropped), a refused request answered with
an error before closing. Its requests are the handler's (handler.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.server import AsyncEventHandler

from .events import RequestError, read_event
from .limits import Connections, NotReading

log = logging.getLogger("hayakoe_pi.wyoming")

DRAIN_BEFORE_CLOSE_SECONDS = 2.0
GOODBYE_SECONDS = 2.0  # for the `busy` of a connection closed to make room: its slot is given already
SEND_BUFFER_BYTES = 64 * 1024  # per client in the kernel (and as much in the transport): audio waiting to be read


class Connection(AsyncEventHandler):
    """One client connection; `handle_event` answers its events, those of `request_types`
    requests (they keep the connection: the idle timer, `last_request`)."""

    request_types: frozenset = frozenset()

    def __init__(self, reader, writer, connections: Connections):
        super().__init__(reader, writer)
        self.connections = connections
        self.last_request = time.monotonic()
        self._in_request = False  # a request's event is being handled
        self._evicted: str | None = None  # why it was closed to make room for another address
        self._closing = False  # its last error is being sent
        self._task: asyncio.Task | None = None
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

    def answering(self) -> bool:
        """A request is being answered (the handler adds a streamed request left open)."""
        return self._in_request

    def evict(self, reason: str) -> None:
        """Close this connection to make room for another address (its slot is given already)."""
        self._evicted = reason
        if self._task is not None:
            self._task.cancel()

    async def run(self) -> None:
        log.debug("wyoming: %s connected", self.peer)
        self._task = asyncio.current_task()
        refusal = self.connections.admit(self)
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
                        log.info("wyoming: %s sent no request for %g s (pings and unknown events do not count): "
                                 "disconnected", self.peer, idle_timeout)
                        break
                    if event is None:
                        break
                    # only a request keeps a connection: pings or made-up events alone must not hold one
                    request = event.type in self.request_types
                    if request:
                        self.last_request, self._in_request = time.monotonic(), True
                    try:
                        if not await self.handle_event(event):
                            break
                    finally:
                        self._in_request = False
                    if request:
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
            if self._evicted is None:  # the server stops
                raise
            self._task.uncancel()
            self._abandon_stream()
            if not self._closing:  # else its own error went out already
                try:
                    await asyncio.wait_for(self._close_with_error(self._evicted, "busy"), GOODBYE_SECONDS)
                except asyncio.TimeoutError:
                    pass
        except Exception as e:  # a bug must not end the server
            log.exception("wyoming: internal error with %s", self.peer)
            self._abandon_stream()
            await self._close_with_error(f"internal error: {type(e).__name__}: {e}", "internal-error")
        finally:
            self.connections.leave(self)
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
        self._closing = True
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

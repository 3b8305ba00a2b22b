"""What the Wyoming clients may take between them: connections (in all and per address), syntheses
at once, and how long the server waits for a client to read (the port is open to the whole LAN)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field

log = logging.getLogger("hayakoe_pi.wyoming")

MAX_CLIENTS = 16  # connections at once; more are refused at once, with an error
# one address may hold this many of them: another address finds a free one unless four hosts take all theirs
MAX_CLIENTS_PER_PEER = 4
# a request's audio must be taken at half real time at least (Home Assistant reads as fast as the
# network goes, a player at real time); write_timeout of lag is forgiven
MIN_READ_RATE = 0.5
POLL_SECONDS = 0.02  # how often a synthesis is looked at to free its slot


class NotReading(ConnectionError):
    """The client has not taken what was sent for write_timeout seconds, or takes it too slowly."""


@dataclass
class ReadPace:
    """How long one request's client has kept the server waiting to take its audio."""

    rate: int  # samples per second
    grace: float  # write_timeout
    waited: float = 0.0

    def waited_for(self, seconds: float, samples_sent: int) -> None:
        """Count a wait; NotReading once the client is behind MIN_READ_RATE by more than the grace.
        Only time waiting for the client counts, never the time synthesis takes."""
        self.waited += seconds
        if self.waited > self.grace + samples_sent / self.rate / MIN_READ_RATE:
            raise NotReading(f"took the audio slower than {MIN_READ_RATE:g}x real time")


@dataclass
class Connections:
    """Shared by every handler (all run on the server's one loop): the clients connected, by
    address, and the syntheses allowed at once (the rest wait in order)."""

    max_syntheses: int = 2
    write_timeout: float = 30.0
    idle_timeout: float = 120.0  # without a request (pings do not count)
    count: int = 0
    peers: Counter = field(default_factory=Counter)
    _refusing: set = field(default_factory=set)  # the limits whose refusals were logged already
    _syntheses: asyncio.Semaphore | None = None

    def admit(self, host: str) -> str | None:
        """Count a new connection from `host`, or the reason it is refused (logged once, not again
        until a connection under that limit closes)."""
        if self.count >= MAX_CLIENTS:
            limit, reason = None, f"{MAX_CLIENTS} clients connected"
        elif self.peers[host] >= MAX_CLIENTS_PER_PEER:
            limit, reason = host, f"{MAX_CLIENTS_PER_PEER} connections from {host}"
        else:
            self.count += 1
            self.peers[host] += 1
            return None
        if limit not in self._refusing:
            self._refusing.add(limit)
            log.warning("wyoming: refusing %s: %s already (logged once until one closes)", host, reason)
        return f"busy: {reason}; try again later"

    def leave(self, host: str) -> None:
        self.count -= 1
        self.peers[host] -= 1
        if not self.peers[host]:
            del self.peers[host]
        self._refusing.difference_update({None, host})

    @property
    def syntheses(self) -> asyncio.Semaphore:
        if self._syntheses is None:  # made on the loop that uses it
            self._syntheses = asyncio.Semaphore(self.max_syntheses)
        return self._syntheses

    async def synthesis_slot(self) -> asyncio.Future:
        """Wait (in order) until fewer than max_syntheses run; the slot is freed by resolving the
        future returned. Held while synthesis runs, not while a slow client reads."""
        await self.syntheses.acquire()
        slot = asyncio.get_running_loop().create_future()
        slot.add_done_callback(lambda _: self.syntheses.release())
        return slot

    @staticmethod
    async def free_when_synthesized(ahead, slot: asyncio.Future) -> None:
        while ahead.synthesizing:
            await asyncio.sleep(POLL_SECONDS)
        if not slot.done():
            slot.set_result(None)

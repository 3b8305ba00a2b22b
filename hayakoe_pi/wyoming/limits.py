"""What the Wyoming clients may take between them: connections (in all and per address), turns
at synthesis, and how long the server waits for a client to read (the port is open to the whole LAN)."""

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
POLL_SECONDS = 0.02  # how often a synthesis is looked at to give up or take back its turn


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
    address, and the turns at synthesis (max_syntheses at once, the rest wait in order)."""

    max_syntheses: int = 2
    write_timeout: float = 30.0
    idle_timeout: float = 120.0  # without a request (pings do not count)
    count: int = 0
    peers: Counter = field(default_factory=Counter)
    _refusing: set = field(default_factory=set)  # the limits whose refusals were logged already
    _turns: asyncio.Semaphore | None = None

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
    def turns(self) -> asyncio.Semaphore:
        if self._turns is None:  # made on the loop that uses it
            self._turns = asyncio.Semaphore(self.max_syntheses)
        return self._turns

    async def synthesis_turn(self) -> SynthesisTurn:
        """Wait (in order) until fewer than max_syntheses computing requests hold a turn."""
        turn = SynthesisTurn(self.turns)
        await turn.take()
        return turn


class SynthesisTurn:
    """One request's turn at synthesis. Held while its synthesis computes; given up while
    synthesis waits for a slow client to take the audio (it runs a bounded stretch ahead), and
    taken again, in order, before synthesis may go on."""

    def __init__(self, turns: asyncio.Semaphore):
        self._turns = turns
        self.held = False
        self._taken = 0  # samples the client has taken
        self._closed = False
        self._task: asyncio.Task | None = None

    async def take(self) -> None:
        await self._turns.acquire()
        self.held = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self._turns.release()

    def follow(self, ahead) -> None:
        """Hold the turn for `ahead`'s synthesis (ahead.SynthesisAhead) until it ends."""
        self._ahead = ahead
        self._task = asyncio.get_running_loop().create_task(self._follow(ahead))

    def taken(self, samples: int) -> None:
        """The client has taken `samples`: synthesis may go on, once the turn is held."""
        self._taken = samples
        if self.held:
            self._ahead.played(samples)

    def close(self) -> None:
        """The request is over (synthesis finished or cancelled): the turn goes once synthesis stops."""
        self._closed = True
        if not self.held and self._task is not None:
            self._task.cancel()

    async def _follow(self, ahead) -> None:
        try:
            while ahead.synthesizing:
                if self.held and ahead.waits_for_reader():
                    self.give_back()
                elif not self.held and not self._closed and not ahead.waits_for_reader(self._taken):
                    await self.take()
                    ahead.played(self._taken)
                await asyncio.sleep(POLL_SECONDS)
        finally:
            self.give_back()

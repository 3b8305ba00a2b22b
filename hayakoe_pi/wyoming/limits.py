"""What the Wyoming clients may take between them: connections (in all and per address, and
which one makes room for a newcomer), turns at synthesis, and how long the server waits for a
client to read (the port is open to the whole LAN)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger("hayakoe_pi.wyoming")

MAX_CLIENTS = 16  # connections at once; more are refused at once, with an error
# one address may hold this many of them: another address finds a free one unless four hosts take all theirs
MAX_CLIENTS_PER_PEER = 4
# when all are held, a connection from an address holding none takes one of them (Connections.admit);
# an address that lost one so cannot take one back for this long (two addresses cannot swap them forever)
TAKEN_FROM_WAITS_S = 60.0
MAX_UNKNOWN_EVENTS = 8  # answered on one connection; the next closes it (they are not requests)
# a request's audio must be taken at half real time at least (Home Assistant reads as fast as the
# network goes, a player at real time); write_timeout of lag is forgiven
MIN_READ_RATE = 0.5
POLL_SECONDS = 0.02  # how often a synthesis is looked at to give up or take back its turn


class Held(Protocol):
    """What the limits know of a connection (connection.Connection)."""

    host: str
    peer: str
    last_request: float  # monotonic: when it connected, or its last request began

    def answering(self) -> bool: ...

    def evict(self, reason: str) -> None: ...


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
    idle_timeout: float = 120.0  # without a request (pings and unknown events do not count)
    held: set = field(default_factory=set)  # the connections holding a slot
    peers: Counter = field(default_factory=Counter)
    _taken_from: dict = field(default_factory=dict)  # address -> until when it may not take a slot
    _refusing: set = field(default_factory=set)  # the limits whose refusals were logged already
    _turns: Turns | None = None

    @property
    def count(self) -> int:
        return len(self.held)

    def admit(self, newcomer: Held) -> str | None:
        """Give `newcomer` a slot, or the reason it is refused (logged once, not again until a
        connection under that limit closes). When all are held, a newcomer from an address
        holding none takes the slot of another (`_room_for`), so that however many slots the
        other hosts keep with requests, Home Assistant opening its connection is let in at once."""
        host = newcomer.host
        if self.peers[host] >= MAX_CLIENTS_PER_PEER:
            limit, reason = host, f"{MAX_CLIENTS_PER_PEER} connections from {host}"
        elif self.count >= MAX_CLIENTS and (victim := self._room_for(host)) is None:
            limit, reason = None, f"{MAX_CLIENTS} clients connected"
        else:
            if self.count >= MAX_CLIENTS:
                self._make_room(victim, host)
            self.held.add(newcomer)
            self.peers[host] += 1
            return None
        if limit not in self._refusing:
            self._refusing.add(limit)
            log.warning("wyoming: refusing %s: %s already (logged once until one closes)", host, reason)
        return f"busy: {reason}; try again later"

    def _room_for(self, host: str) -> Held | None:
        """The connection a newcomer from `host` may take the slot of: none if `host` holds one
        already or lost one lately; else one of the address holding the most, the one longest
        without a request (one answering a request last: the longest answered first)."""
        now = time.monotonic()
        if self.peers[host] or self._taken_from.get(host, 0.0) > now:
            return None
        return max(self.held, key=lambda c: (self.peers[c.host], not c.answering(), now - c.last_request))

    def _make_room(self, victim: Held, host: str) -> None:
        now = time.monotonic()
        self._taken_from = {h: t for h, t in self._taken_from.items() if t > now}
        # once per address for as long as it waits: a host with many addresses cannot flood the log
        level = logging.DEBUG if victim.host in self._taken_from else logging.WARNING
        log.log(level, "wyoming: %s (%d connections from %s) closed to make room for %s: all %d held",
                victim.peer, self.peers[victim.host], victim.host, host, MAX_CLIENTS)
        self._taken_from[victim.host] = now + TAKEN_FROM_WAITS_S
        self.leave(victim)
        victim.evict(f"busy: closed to make room for another address (all {MAX_CLIENTS} connections "
                     f"were held, {MAX_CLIENTS_PER_PEER} at most from one address)")

    def leave(self, connection: Held) -> None:
        """`connection` gives its slot back (once: a connection closed to make room gave it already)."""
        if connection not in self.held:
            return
        self.held.discard(connection)
        host = connection.host
        self.peers[host] -= 1
        if not self.peers[host]:
            del self.peers[host]
        self._refusing.difference_update({None, host})

    @property
    def turns(self) -> Turns:
        if self._turns is None:  # made on the loop that uses it
            self._turns = Turns(self.max_syntheses)
        return self._turns

    async def synthesis_turn(self, host: str | None = None) -> SynthesisTurn:
        """Wait until fewer than max_syntheses computing requests hold a turn: first those from
        the addresses holding the fewest connections, in order among them."""
        turn = SynthesisTurn(self.turns, lambda: self.peers[host] if host is not None else 0)
        await turn.take()
        return turn


class Turns:
    """`size` turns; those waiting get a free one by rank (lowest first; looked at when one is
    free), in order among equals: a host holding many connections cannot queue ahead of another."""

    def __init__(self, size: int):
        self.free = size
        self._waiting: list = []  # [rank (a function), order, future]
        self._order = 0

    def locked(self) -> bool:
        return self.free == 0

    async def acquire(self, rank=lambda: 0) -> None:
        if self.free:
            self.free -= 1
            return
        self._order += 1
        entry = [rank, self._order, asyncio.get_running_loop().create_future()]
        self._waiting.append(entry)
        try:
            await entry[2]
        except asyncio.CancelledError:
            if entry[2].done() and not entry[2].cancelled():  # given just as the waiter went
                self.release()
            else:
                self._waiting.remove(entry)
            raise

    def release(self) -> None:
        self.free += 1
        while self.free and self._waiting:
            entry = min(self._waiting, key=lambda e: (e[0](), e[1]))
            self._waiting.remove(entry)
            self.free -= 1
            entry[2].set_result(None)


class SynthesisTurn:
    """One request's turn at synthesis. Held while its synthesis computes; given up while
    synthesis waits for a slow client to take the audio (it runs a bounded stretch ahead), and
    taken again, by rank and in order (Turns), before synthesis may go on."""

    def __init__(self, turns: Turns, rank=lambda: 0):
        self._turns, self._rank = turns, rank
        self.held = False
        self._taken = 0  # samples the client has taken
        self._closed = False
        self._task: asyncio.Task | None = None

    async def take(self) -> None:
        await self._turns.acquire(self._rank)
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


class FreeTurn:
    """A request reading a synthesis another request holds the turn for (speech/shared.py):
    what it takes lets synthesis go on, and it waits for no turn."""

    def follow(self, ahead) -> None:
        self._ahead = ahead

    def taken(self, samples: int) -> None:
        self._ahead.played(samples)

    def give_back(self) -> None:
        pass

    def close(self) -> None:
        pass

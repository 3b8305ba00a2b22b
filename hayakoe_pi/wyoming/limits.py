"""What the Wyoming clients may take between them: connections, syntheses at once, and how
long the server waits for a client to read (the port is open to the whole LAN)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

MAX_CLIENTS = 16  # connections at once; more are refused at once, with an error
POLL_SECONDS = 0.02  # how often a synthesis is looked at to free its slot


class NotReading(ConnectionError):
    """The client has not taken what was sent for write_timeout seconds."""


@dataclass
class Connections:
    """Shared by every handler (all run on the server's one loop): how many clients are
    connected, and the syntheses allowed at once (the rest wait in order)."""

    max_syntheses: int = 2
    write_timeout: float = 30.0
    count: int = 0
    _syntheses: asyncio.Semaphore | None = None

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

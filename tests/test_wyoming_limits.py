"""The Wyoming port as anyone on the LAN can use it: clients that ask for audio and never read
it, a burst over the connection limit; Home Assistant and MQTT must still be served."""

import socket
import time

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.event import write_event
from wyoming.tts import Synthesize

from harness import appliance, free_port, wait_for

LONG = "冷蔵庫のドアが開いています。閉めてください。" * 2  # ~5 s: more audio than the socket buffers hold (~2 s)


@pytest.fixture
def app(tmp_path):
    port = free_port()
    with appliance(tmp_path, wyoming={"enabled": True, "host": "127.0.0.1", "port": port, "zeroconf": False,
                                      "write_timeout_s": 2}) as app:
        app.wyoming_port = port
        wait_for(lambda: "wyoming: serving on" in app.daemon.output(), 30, what="the Wyoming server")
        yield app


def never_reads(port: int) -> socket.socket:
    """Connect with a tiny receive window, ask for a long text, and never read a byte."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    with s.makefile("wb") as out:
        write_event(Synthesize(text=LONG).event(), out)
    return s


async def served_in(port: int, text: str) -> float:
    started = time.monotonic()
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize(text=text).event())
        while (event := await client.read_event()) is not None and event.type != "audio-stop":
            assert event.type != "error", event.data
    assert event is not None
    return time.monotonic() - started


def test_clients_that_never_read_are_dropped_and_others_still_served(app):
    import asyncio

    bad = [never_reads(app.wyoming_port) for _ in range(20)]
    try:
        log = app.daemon.output
        wait_for(lambda: log().count("clients connected already") == 4, 5, what="the 4 over the limit refused")
        # the 16 let in are dropped once they have not read for write_timeout_s
        wait_for(lambda: log().count("stopped reading for 2 s: disconnected") == 16, 60,
                 what="the clients that never read to be dropped")
        seconds = asyncio.run(served_in(app.wyoming_port, "お風呂が沸きました。"))
        assert seconds < 2.0, seconds
        assert app.probe.reply("say", {"text": "玄関の鍵が開いています。", "id": "mqtt"})["event"] == "finished"
    finally:
        for s in bad:
            s.close()


def test_at_most_max_syntheses_run_at_once_and_the_rest_wait_in_order():
    """The slots of wyoming.max_syntheses: taken in order, each freed when its synthesis ends
    (not when its client has read everything)."""
    import asyncio
    from types import SimpleNamespace

    from hayakoe_pi.wyoming.limits import Connections

    async def scenario():
        connections = Connections(max_syntheses=2)
        syntheses = [SimpleNamespace(synthesizing=True) for _ in range(4)]
        order = []

        async def request(n):
            slot = await connections.synthesis_slot()
            order.append(n)
            await connections.free_when_synthesized(syntheses[n], slot)

        tasks = [asyncio.create_task(request(n)) for n in range(4)]
        await asyncio.sleep(0.1)
        assert order == [0, 1]  # two at once; the others wait
        syntheses[1].synthesizing = False
        await asyncio.sleep(0.1)
        assert order == [0, 1, 2]  # the first to wait goes first
        for s in syntheses:
            s.synthesizing = False
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3]

    asyncio.run(scenario())

"""The Wyoming protocol: Home Assistant Assist uses the appliance as a local TTS engine.

A TCP server (config `wyoming`) in its own thread with its own asyncio loop,
a front door of the speech service beside MQTT's: same voices, selection and
phrase cache. Nothing received here is played on the Pi: the audio goes back
to the client as 16-bit mono PCM.

    describe                      -> info (voices, their styles as speakers)
    synthesize                    -> audio-start, audio-chunk..., audio-stop
    synthesize-start, synthesize-chunk..., synthesize-stop
                                  -> audio-start, audio-chunk..., audio-stop, synthesize-stopped
    ping                          -> pong
    anything else                 -> error (the connection stays open, for 8 of them; not a request)

    server.py      the server's thread, loop and listening socket; Info
    connection.py  one connection's life under the limits: admitted, idle, writes timed
    handler.py     one client connection: its requests and their audio
    events.py      reading events with limits on what a client may make us buffer
    limits.py      what the clients may take between them: connections (per address too, and
                   a newcomer's room), turns at synthesis, how slowly a client may read
    announce.py    the zeroconf announcement
"""

from .announce import SERVICE_TYPE, instance_name, service_info
from .events import ProtocolError, read_event
from .handler import ready_text
from .server import WyomingServer

__all__ = ["SERVICE_TYPE", "ProtocolError", "WyomingServer", "instance_name", "read_event", "ready_text",
           "service_info"]

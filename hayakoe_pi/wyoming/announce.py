"""The zeroconf announcement that lets Home Assistant discover the Wyoming server."""

from __future__ import annotations

import asyncio
import logging
import socket

from .. import __version__
from ..settings.config import Identity

log = logging.getLogger("hayakoe_pi.wyoming")

SERVICE_TYPE = "_wyoming._tcp.local."
PROGRAM = "hayakoe-pi"
LANGUAGES = ["ja"]
RETRY_SECONDS = 30.0


def instance_name(hostname: str | None = None) -> str:
    """The zeroconf instance name of a Pi without device.id (as before there were several): one DNS label."""
    host = (hostname or socket.gethostname()).split(".")[0] or "localhost"
    return f"{PROGRAM}-{host}"[:63]


def device_instance_name(identity: Identity) -> str:
    """This Pi's zeroconf instance name (Home Assistant's id for the engine): from device.id,
    since every Pi OS image is called raspberrypi."""
    return instance_name() if identity.legacy else f"{PROGRAM}-{identity.id}"[:63]


def local_address(host: str) -> str:
    """The IPv4 address to announce for a server bound to `host`; OSError while there is none."""
    if host not in ("", "0.0.0.0", "::"):
        return socket.gethostbyname(host)
    # the interface that multicast leaves by (connecting a UDP socket sends nothing)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("224.0.0.251", 5353))
        address = s.getsockname()[0]
    if address.startswith("127.") or address == "0.0.0.0":
        raise OSError(f"no network address yet (got {address})")
    return address


def service_info(name: str, port: int, address: str):
    """The zeroconf record announcing `name` as a Wyoming service (not registered)."""
    from zeroconf.asyncio import AsyncServiceInfo

    return AsyncServiceInfo(
        SERVICE_TYPE, f"{name}.{SERVICE_TYPE}", port=port,
        addresses=[socket.inet_aton(address)],
        properties={"program": PROGRAM, "version": __version__, "languages": ",".join(LANGUAGES)},
    )


async def announce(host: str, port: int, name: str) -> None:
    """Register the service (retrying while the network is not up); unregister when cancelled."""
    try:
        from zeroconf import InterfaceChoice, IPVersion
        from zeroconf.asyncio import AsyncZeroconf
    except ImportError:
        log.error("wyoming: zeroconf is not installed; add the integration by host and port")
        return
    while True:
        aiozc = None
        try:
            info = service_info(name, port, local_address(host))
            # Default interface, IPv4: no interface enumeration (no netlink socket needed)
            aiozc = AsyncZeroconf(interfaces=InterfaceChoice.Default, ip_version=IPVersion.V4Only)
            registered = await aiozc.async_register_service(info, allow_name_change=True)
            await registered  # probing and the first announcements done
            log.info("wyoming: announced as %s (%s) over zeroconf", info.name, info.parsed_addresses()[0])
            break
        except asyncio.CancelledError:
            if aiozc is not None:
                await aiozc.async_close()
            raise
        except Exception as e:
            log.warning("wyoming: zeroconf announcement failed (%s: %s); retrying in %g s",
                        type(e).__name__, e, RETRY_SECONDS)
            if aiozc is not None:
                try:
                    await aiozc.async_close()
                except Exception:
                    pass
            await asyncio.sleep(RETRY_SECONDS)
    try:
        await asyncio.Event().wait()  # until cancelled
    finally:
        try:
            await asyncio.wait_for(aiozc.async_unregister_all_services(), 1.0)
            await asyncio.wait_for(aiozc.async_close(), 1.0)
        except Exception as e:
            log.debug("wyoming: zeroconf close: %s", e)

"""systemd's readiness protocol (sd_notify) without a library: one datagram to $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket


def sd_notify(message: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(message.encode())
    return True

"""Where the other nodes of a job may reach this one: the leader's line (``conduct/link.py``)
and every node's peer server (``sync/_peers.py``) publish these addresses for each other."""

from __future__ import annotations

import socket


def addresses() -> list[str]:
    """This node's name, then its addresses (those of its name, and the one its default route
    leaves by), loopback last."""
    name = socket.gethostname()
    found = [name]
    try:
        found += socket.gethostbyname_ex(name)[2]
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET: a UDP connect picks the route and sends nothing
            found.append(s.getsockname()[0])
    except OSError:
        pass
    unique = list(dict.fromkeys(found))
    return [a for a in unique if not a.startswith("127.")] + [a for a in unique if a.startswith("127.")]

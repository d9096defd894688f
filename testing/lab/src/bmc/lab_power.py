"""What every power emulator of the lab (Redfish, IPMI, the AWS cloud) tells the lab: a node's
power goes off or on. The lab acts on it (kills or boots the node) before it answers `ok`, so the
emulator stores the new state only once it is true."""

import socket


def report(verb, node, path):
    """Tells the lab, on its socket `path`, that `node`'s power goes `verb` ("off" or "on"), and
    waits for its `ok`; raises RuntimeError when the lab does not acknowledge it."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(120)
        s.connect(path)
        s.sendall(f"{verb} {node}\n".encode())
        answer = s.makefile().readline().strip()
    if answer != "ok":
        raise RuntimeError(f"the lab did not acknowledge '{verb} {node}': {answer!r}")

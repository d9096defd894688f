"""A lab BMC speaking Redfish: sushy-tools' emulator with its fake driver and one system, whose
every power change is reported to the lab, and acknowledged, before the emulator goes on. So a
BMC never says Off while its node still runs: the lab kills the node before it answers `off`.

The power state lives in POWER_FILE ("On"/"Off"), shared with the node's IPMI BMC
(ipmi_chassis.py) under an flock: one BMC, two protocols.

Run with the sushy-tools virtualenv's python (the lab writes this file into its directory):
    sushy_bmc.py NODE LISTEN_IP PORT UUID CERT KEY STATE_DIR POWER_FILE REPORT_SOCKET none|realistic
The credentials come from BMC_USERNAME and BMC_PASSWORD, so they stay out of the process list.
"""

import fcntl
import os
import sys
import threading
import time

import bcrypt
from sushy_tools.emulator import main as emulator
from sushy_tools.emulator.resources.systems import fakedriver

import lab_power

NODE, LISTEN, PORT, UUID, CERT, KEY, STATE, POWER_FILE, REPORT, DELAYS = sys.argv[1:11]


def report(power_state):
    """Tells the lab the node's power goes `off` or `on` and waits for its `ok`."""
    lab_power.report("off" if power_state == "Off" else "on", NODE, REPORT)


class PowerLock:
    """Held for every read-modify-write of the power state: re-entrant across this process's
    threads (Flask serves requests on threads, a timer applies delayed transitions), and an
    flock on the power file against the IPMI BMC."""

    def __init__(self):
        self.lock = threading.RLock()
        self.depth = 0
        self.file = None

    def __enter__(self):
        self.lock.acquire()
        if self.depth == 0:
            self.file = open(POWER_FILE, "r+")
            fcntl.flock(self.file, fcntl.LOCK_EX)
        self.depth += 1

    def __exit__(self, *exc):
        self.depth -= 1
        if self.depth == 0:
            self.file.close()  # releases the flock
        self.lock.release()


LOCK = PowerLock()


def stored_power():
    """The shared power state; only under LOCK."""
    LOCK.file.seek(0)
    return LOCK.file.read().strip()


def store_power(state):
    LOCK.file.seek(0)
    LOCK.file.write(state)
    LOCK.file.truncate()
    LOCK.file.flush()


Driver = fakedriver.FakeDriver
original_update = Driver._update
original_update_if_needed = Driver._update_if_needed
original_set_power_state = Driver.set_power_state


def _update(self, system, **changes):
    if isinstance(system, str):  # boot settings by identity: never a power change
        return original_update(self, system, **changes)
    with LOCK:
        # `set_power_state` with a Restart sets power_state Off on the dict itself, so compare
        # what is about to be stored with what is stored, not with the changes alone.
        new = changes.get("power_state", system["power_state"])
        if new != stored_power():
            report(new)  # raises when the lab does not acknowledge: nothing is stored
            store_power(new)
        original_update(self, system, **changes)


def _update_if_needed(self, system):
    with LOCK:
        # The caller read `system` before taking the lock: apply what is stored now, so a stale
        # copy never undoes a newer request; the power state is the shared file's.
        fresh = self._systems[system["uuid"]]
        fresh["power_state"] = stored_power()
        system.clear()
        system.update(fresh)
        return original_update_if_needed(self, system)


def set_power_state(self, identity, state):
    with LOCK:
        original_set_power_state(self, identity, state)
        uuid = self.uuid(identity)
        pending = self._systems[uuid].get("pending_power")
    if not pending:
        return
    delay = pending["apply_time"] - time.time()
    if delay <= 0:
        self._get(uuid)  # applies (and reports) the change before the request is answered
    else:
        # A real BMC finishes a transition whether or not anyone asks; the emulator alone would
        # wait for the next GET.
        timer = threading.Timer(delay + 0.05, self._get, args=(uuid,))
        timer.daemon = True
        timer.start()


Driver._update = _update
Driver._update_if_needed = _update_if_needed
Driver.set_power_state = set_power_state
if DELAYS == "none":
    fakedriver.random = type("NoDelay", (), {"randint": staticmethod(lambda a, b: 0)})

htpasswd = os.path.join(STATE, "htpasswd")
with open(htpasswd, "w") as f:
    # Cost 4: the emulator checks the password on every request; this is a test BMC.
    digest = bcrypt.hashpw(os.environ["BMC_PASSWORD"].encode(), bcrypt.gensalt(rounds=4))
    f.write(f"{os.environ['BMC_USERNAME']}:{digest.decode()}\n")

emulator.app.configure(
    extra_config={
        "SUSHY_EMULATOR_LISTEN_IP": LISTEN,
        "SUSHY_EMULATOR_LISTEN_PORT": int(PORT),
        "SUSHY_EMULATOR_SSL_CERT": CERT,
        "SUSHY_EMULATOR_SSL_KEY": KEY,
        "SUSHY_EMULATOR_AUTH_FILE": htpasswd,
        # The fake driver keeps its systems in sqlite, by default in /tmp/sushy-emulator, shared
        # by every emulator on the machine.
        "SUSHY_EMULATOR_STATE_DIR": STATE,
        "SUSHY_EMULATOR_FAKE_DRIVER": True,
        "SUSHY_EMULATOR_FAKE_SYSTEMS": [
            {
                "uuid": UUID,
                "name": "1",  # what `--systems-uri=/redfish/v1/Systems/1` asks for
                "power_state": "On",
                "external_notifier": False,
                "nics": [],
            }
        ],
    }
)
sys.argv = [sys.argv[0]]
sys.exit(emulator.main())

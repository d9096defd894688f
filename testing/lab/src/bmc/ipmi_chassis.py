"""ipmi_sim's chassis_control for a lab BMC: keeps the BMC's power state in a file ("On"/"Off",
shared with the node's Redfish BMC under an flock) and reports every change to the lab,
waiting for its acknowledgement, before ipmi_sim answers (ipmi_sim runs this synchronously for
each request). So the BMC never says off while its node still runs.

ipmi_sim runs it as `ipmi_chassis.py NODE POWER_FILE REPORT_SOCKET <mc> get power ...` and
`... <mc> set power "0"|"1" ...` (also `reset` and `shutdown`); see OpenIPMI's
lanserv/ipmi_sim_chassiscontrol. Errors go to stdout, which ipmi_sim logs.
"""

import fcntl
import sys

import lab_power

NODE, STATE, REPORT = sys.argv[1:4]
OP, ARGS = sys.argv[5], sys.argv[6:]


def report(verb):
    try:
        lab_power.report(verb, NODE, REPORT)
    except RuntimeError as e:
        print(e)
        sys.exit(1)


STATE_FILE = open(STATE, "r+")
fcntl.flock(STATE_FILE, fcntl.LOCK_EX)  # held until exit: one change at a time per BMC


def power():
    STATE_FILE.seek(0)
    return STATE_FILE.read().strip() == "On"


def set_power(on):
    if on != power():
        report("on" if on else "off")
        STATE_FILE.seek(0)
        STATE_FILE.write("On" if on else "Off")
        STATE_FILE.truncate()
        STATE_FILE.flush()


if OP == "get":
    for parm in ARGS:
        if parm == "power":
            print(f"power:{1 if power() else 0}")
        elif parm == "boot":
            print("boot:default")
        else:
            print(f"Invalid parameter: {parm}")
            sys.exit(1)
elif OP == "set":
    for parm, value in zip(ARGS[::2], ARGS[1::2]):
        if parm == "power":
            set_power(value.strip() != "0")
        elif parm == "shutdown":  # a soft shutdown: the lab has no OS to ask, so power off
            set_power(False)
        elif parm == "reset" and power():  # a hard reset of a running machine is a power cycle
            report("off")
            report("on")
elif OP == "check":
    sys.exit(1)  # ipmi_sim's example does not support check either
else:
    print(f"Unknown operation: {OP}")
    sys.exit(1)

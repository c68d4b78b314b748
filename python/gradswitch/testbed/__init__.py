"""Emulated cluster for gradswitch: worker, host and switch network namespaces joined by a bridge
(or, with switch="dpdk", by gradswitchd --backend dpdk); several switch machines (switches=S) or
racks with leaves and a spine (racks=R, workers_per_rack=W).

from gradswitch.testbed import Testbed
with Testbed(workers=4, rate="1gbit") as tb:
    tb.exec("w0", ["ping", "-c1", tb.address("host")])
"""

from .core import (
    PREFIX,
    STATE_DIR,
    LinkOptions,
    Testbed,
    TestbedError,
    check_environment,
    leftovers,
    list_testbeds,
    parse_rate,
    remove_testbed,
)
from .dpdk import DpdkOptions

__all__ = [
    "PREFIX",
    "DpdkOptions",
    "STATE_DIR",
    "LinkOptions",
    "Testbed",
    "TestbedError",
    "check_environment",
    "leftovers",
    "list_testbeds",
    "parse_rate",
    "remove_testbed",
]

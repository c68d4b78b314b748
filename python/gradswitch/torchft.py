"""torchft integration of gradswitch: a reconfigurable process group for torchft's replica dimension
(docs/torch.md, "torchft").

    from gradswitch.torchft import ProcessGroupGradswitch
    manager = torchft.Manager(pg=ProcessGroupGradswitch(switch="127.0.0.1:7700"), min_replica_size=2, ...)

torchft calls configure() with a fresh store address at every quorum change; each call aborts the
previous gradswitch process group (its job at the switch ends) and joins a new job at the switch with
the quorum's replica rank and world size, so a replica that died and came back simply joins the next
quorum's job. Allreduce SUM/AVG runs on the switch, every other collective through the gradswitch
process group's internal gloo group (gradswitch.torch.ProcessGroupGradswitch).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

try:
    from torchft.process_group import ProcessGroupWrapper
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("gradswitch.torchft needs torchft: pip install torchft==0.2.0") from e

from torch.distributed import Store

from gradswitch.torch import Options
from gradswitch.torch import ProcessGroupGradswitch as _TorchProcessGroup

BACKEND_NAME = "torchft-gradswitch"


class ProcessGroupGradswitch(ProcessGroupWrapper):
    """torchft's reconfigurable process group on the switch (torchft.process_group.ProcessGroupGloo's
    pattern: configure() builds a new inner group per quorum).

    timeout: torchft's timeout for reconfiguration (the store) and, unless `options` set its own, for
        every allreduce without progress and for every replica to join the quorum's job.
    options / **option_fields: gradswitch.torch.Options (switch, wire, algorithm, tenant, ...), as an
        object, a dict, or keyword arguments: ProcessGroupGradswitch(switch="10.0.0.1:7700").
    """

    def __init__(
        self,
        timeout: timedelta = timedelta(seconds=60),
        options: Options | dict | None = None,
        **option_fields: Any,
    ) -> None:
        super().__init__(timeout=timeout)
        options = Options.coerce(options)
        if option_fields:
            options = Options.coerce({**_explicit_fields(options), **option_fields})
        self._options = options

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def _create_pg(self, store: Store, rank: int, world_size: int) -> _TorchProcessGroup:
        seconds = self._timeout.total_seconds()
        options = self._options
        # A quorum's job must fail as fast as torchft expects, not after gradswitch's own defaults:
        # a replica that died mid-allreduce is reported through the switch's abort, and one that
        # never joins within torchft's timeout makes this configure() fail so the next quorum goes on.
        options = dataclasses.replace(
            options,
            timeout=options.timeout or seconds,
            join_timeout=min(options.join_timeout, seconds),
        )
        return _TorchProcessGroup(store, rank, world_size, self._timeout, options)

    def shutdown(self) -> None:
        """Leaves the current quorum's job (torchft's wrapper only drops its reference)."""
        pg = self.gradswitch_group
        if pg is not None:
            pg.shutdown()
        super().shutdown()

    @property
    def gradswitch_group(self) -> _TorchProcessGroup | None:
        """The current quorum's gradswitch.torch.ProcessGroupGradswitch (None before configure)."""
        pg = self._pg
        return pg if isinstance(pg, _TorchProcessGroup) else None


def _explicit_fields(options: Options) -> dict[str, Any]:
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}

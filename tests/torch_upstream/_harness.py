"""torch's upstream distributed_test.py, set up to run on the gradswitch backend (tests/torch_upstream).

Imported in the runner and in every rank the harness spawns (the spawn context re-imports the test
class's module), so the changes below are made identically everywhere, and always before
distributed_test.py is imported: its skip decorators are evaluated when it is imported, from the
environment (BACKEND, WORLD_SIZE) and from DistTestCases' backend sets.

What is changed, from here only (torch's files are untouched):

1. gradswitch joins the harness's feature sets: "ddp" (DDP on CPU models), "subgroup" (new_group),
   "gpu"/"cuda" (the backend takes CUDA tensors: docs/torch.md section 4; without a GPU those tests
   skip with the harness's own "CUDA is not available" / "Need at least N CUDA devices") and "plugin"
   (the harness's availability check for third-party backends).
2. A few skips hard-code backend names (`BACKEND != "gloo" and ...`) for features gradswitch has:
   OVERRIDDEN lists each one's reason and why it does not apply; those decorators are made no-ops while
   distributed_test.py is imported. Every other skip decorator behaves as upstream.
3. The few tests whose body picks its CPU code by backend name see "gloo" (CPU_PATH_BY_NAME); their
   process group is gradswitch's.
4. Ranks start from a forkserver that has imported torch and this module, instead of by spawn.
5. A rank that skips records its reason next to the harness's file store, and the parent reports that
   reason instead of the harness's "Test skipped at subprocess level, look at subprocess log".
"""

from __future__ import annotations

import faulthandler
import fnmatch
import json
import multiprocessing
import os
import sys
import unittest
from pathlib import Path

import torch.testing._internal.common_utils as common_utils
from torch.testing._internal.common_distributed import DistTestCases

import gradswitch.torch  # noqa: F401 - registers the backend in every rank

BACKEND = "gradswitch"
START_METHOD = "forkserver"
FEATURES = ("ddp", "subgroup", "gpu", "cuda", "plugin")

# Name-based skips that do not apply to gradswitch: (the harness's reason, the tests it is lifted for
# (fnmatch), why the feature is there). Any other test with that reason, and every other skip, stays.
OVERRIDDEN: list[tuple[str, str, str]] = [
    (
        "get_future is only supported on mpi, nccl and gloo",
        "*",
        "the backend's Work objects return a torch.futures.Future completed with the reduced tensors "
        "(gradswitch.torch.FutureWork.get_future)",
    ),
    (
        "Test requires backend gradswitch to be one of {'gloo'}",
        "test_all_reduce_coalesced_*",
        "the backend reduces each tensor of a coalesced list (SUM on the switch, MIN/MAX/PRODUCT through "
        "its internal gloo group)",
    ),
    (
        "Test requires backend gradswitch to be one of {'gloo'}",
        "test_grads_same_across_ranks_with_no_sync",
        "the backend supports DDP on CPU models (no_sync, find_unused_parameters)",
    ),
    (
        "Test requires backend gradswitch to be one of {'gloo'}",
        "test_scatter_object_list",
        "scatter runs through the backend's internal gloo group",
    ),
    (
        "Only MPI supports CPU all_to_all_single",
        "*",
        "all_to_all_single runs through the backend's internal gloo group, which has it on CPU",
    ),
    (
        "Only Gloo and NCCL backends will have CUDA allReduce tested",
        "*",
        "the backend reduces CUDA tensors (staged through pinned memory, docs/torch.md section 4); these "
        "tests are skip_if_no_gpu as well",
    ),
    (
        "Only Gloo and Nccl backends support CUDA allReduce",
        "*",
        "the backend serves CUDA tensors (this one, a broadcast, through gloo); skip_if_no_gpu as well",
    ),
    (
        "Only Gloo backend supports sparse all reduce",
        "*",
        "sparse allreduces run through the backend's internal gloo group (docs/torch.md, What runs where)",
    ),
    (
        "GLOO Batch Send Recv CPU",
        "*",
        "send/recv (and so batch_isend_irecv) run through the backend's internal gloo group",
    ),
    (
        "Only gloo backend supports timeouts",
        "*",
        "barrier runs through the backend's internal gloo group, made with the process group's timeout",
    ),
]

# Tests whose body picks its CPU code path by backend name (`if BACKEND == "mpi" or BACKEND == "gloo":
# <build the CPU model>`, nothing for another name): their ranks see BACKEND = "gloo" while the body
# runs. The process group they use is the gradswitch one the harness made before (the name is read
# only by the body; no test in this list creates a group from it). (fnmatch, why)
CPU_PATH_BY_NAME: list[tuple[str, str]] = [
    (
        "test_accumulate_gradients_no_sync*",
        'the body builds its CPU DDP model only `if BACKEND == "mpi" or BACKEND == "gloo"`',
    ),
]

if os.environ.get("BACKEND") != BACKEND:
    raise RuntimeError(f"tests.torch_upstream: run through its runner (BACKEND={BACKEND} in the environment)")

for _feature in FEATURES:
    DistTestCases.backend_feature.setdefault(_feature, set()).add(BACKEND)

overridden_tests: dict[str, str] = {}  # test name -> the name-based skip reason it ran despite


def _lifted(reason: str, func) -> bool:
    if os.environ.get("TORCH_UPSTREAM_NO_LIFTS") == "1":  # --no-lifts: the harness's own skips
        return False
    for r, pattern, _why in OVERRIDDEN:
        if r == reason and fnmatch.fnmatchcase(func.__name__, pattern):
            overridden_tests[func.__name__] = reason
            return True
    return False


def _patched(upstream_if, upstream):
    """common_utils' two skip decorators, which leave a test alone when _lifted says so."""

    def skip_if(condition, reason):
        skip = upstream_if(condition, reason)
        return (lambda func: func if _lifted(reason, func) else skip(func)) if condition else skip

    def skip(reason):
        return lambda func: func if _lifted(reason, func) else upstream(reason)(func)

    return skip_if, skip


_upstream = (common_utils.skip_but_pass_in_sandcastle_if, common_utils.skip_but_pass_in_sandcastle)
common_utils.skip_but_pass_in_sandcastle_if, common_utils.skip_but_pass_in_sandcastle = _patched(*_upstream)
try:
    from torch.testing._internal.distributed import distributed_test
finally:
    common_utils.skip_but_pass_in_sandcastle_if, common_utils.skip_but_pass_in_sandcastle = _upstream

if distributed_test.BACKEND != BACKEND:  # pragma: no cover - imported earlier with another BACKEND
    raise RuntimeError("tests.torch_upstream: distributed_test was imported before the harness patches")


def _env_file(file_name: str) -> Path:
    return Path(f"{file_name}.environ")


def _skip_note(file_name: str, rank: int) -> Path:
    return Path(f"{file_name}.skip-rank{rank}")


class TestGradswitchSpawn(distributed_test.TestDistBackend, distributed_test.DistributedTest._DistTestBase):
    """upstream's TestDistBackendWithSpawn (test/distributed/test_distributed_spawn.py), for gradswitch."""

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _spawn_processes(self) -> None:
        # Upstream spawns: every rank of every test imports torch and this module afresh, many CPU
        # seconds per test. A forkserver that preloaded them (the runner sets that up) starts ranks
        # that are as fresh (forked from a process that never ran a test) at a fraction of the cost.
        # A spawned rank inherits the runner's environment as it is now (setUp has just put this
        # test's TEMP_DIR in it); the forkserver's is the one of its start: hand it over in a file.
        # The tests that re-create the default group do it from INIT_METHOD: a file of this test's
        # TEMP_DIR (a FileStore file that outlives a test holds its counters and hangs the next one).
        os.environ["INIT_METHOD"] = f"file://{os.environ['TEMP_DIR']}/init_file"
        _env_file(self.file_name).write_text(json.dumps(dict(os.environ)))
        self._start_processes(multiprocessing.get_context(START_METHOD).Process)

    def tearDown(self):
        _env_file(self.file_name).unlink(missing_ok=True)
        super().tearDown()

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):  # in a rank
        env = json.loads(_env_file(file_name).read_text())
        os.environ.clear()
        os.environ.update(env)
        distributed_test.INIT_METHOD = env["INIT_METHOD"]  # read at import, in the forkserver
        if env.get("TORCH_UPSTREAM_STACKS_AFTER"):  # --stacks-after: every thread's stack, GIL or not
            faulthandler.dump_traceback_later(float(env["TORCH_UPSTREAM_STACKS_AFTER"]), repeat=False)
        super()._run(rank, test_name, file_name, pipe, **kwargs)

    def run_test(self, test_name: str, parent_pipe) -> None:  # in a rank
        body = getattr(self, test_name)

        def recorded():
            try:
                body()
            except unittest.SkipTest as e:
                _skip_note(self.file_name, self.rank).write_text(str(e))
                raise

        setattr(self, test_name, recorded)
        lifts = os.environ.get("TORCH_UPSTREAM_NO_LIFTS") != "1"
        if lifts and any(fnmatch.fnmatchcase(test_name, p) for p, _why in CPU_PATH_BY_NAME):
            distributed_test.BACKEND = "gloo"
        try:
            super().run_test(test_name, parent_pipe)
        finally:
            distributed_test.BACKEND = BACKEND

    def _check_return_codes(self, fn, elapsed_time) -> None:  # in the runner
        try:
            super()._check_return_codes(fn, elapsed_time)
        except unittest.SkipTest as e:
            notes = [_skip_note(self.file_name, r) for r in range(int(self.world_size))]
            reasons = sorted({n.read_text() for n in notes if n.exists()})
            raise unittest.SkipTest("; ".join(reasons) or str(e)) from None
        finally:
            for r in range(int(self.world_size)):
                _skip_note(self.file_name, r).unlink(missing_ok=True)


def test_names() -> list[str]:
    return sorted(n for n in dir(TestGradswitchSpawn) if n.startswith("test_"))


def upstream_file() -> str:
    return sys.modules[distributed_test.__name__].__file__ or ""

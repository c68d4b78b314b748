"""Baselines gradswitch is compared against, each run on the emulated testbed with sums verified:
host aggregation (hostagg), torch.distributed gloo ring allreduce (gloo), Open MPI MPI_Allreduce
(mpi_allreduce) and MPI_Reduce to the host + MPI_Bcast (mpi_reduce_bcast).

    from gradswitch.testbed import Testbed
    from gradswitch.baselines import run
    with Testbed(workers=4, rate="1gbit") as tb:
        print(run("hostagg", tb, nbytes=16 << 20, iters=5).summary())
"""

from .common import Result
from .runner import SYSTEMS, BaselineError, run, run_gloo, run_hostagg, run_mpi

__all__ = ["SYSTEMS", "BaselineError", "Result", "run", "run_gloo", "run_hostagg", "run_mpi"]

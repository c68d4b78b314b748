"""Where the installed pieces of gradswitch live."""

from __future__ import annotations

import os
from pathlib import Path

_ENV = "GRADSWITCHD"


def _candidates() -> list[Path]:
    here = Path(__file__).resolve().parent
    out = [here / "bin" / "gradswitchd"]
    # Editable installs (scikit-build-core) put built files next to the installed package, not
    # next to the sources: look through the package's search path as well.
    try:
        import gradswitch

        for p in getattr(gradswitch, "__path__", []):
            out.append(Path(p) / "bin" / "gradswitchd")
    except ImportError:  # pragma: no cover
        pass
    return out


def switch_binary() -> str:
    """Path of the switch daemon: $GRADSWITCHD if set, else the package's bin/gradswitchd.

    Raises FileNotFoundError (naming what was tried) when there is none.
    """
    env = os.environ.get(_ENV)
    if env:
        if not os.access(env, os.X_OK):
            raise FileNotFoundError(f"${_ENV}={env!r} is not an executable file")
        return env
    tried = _candidates()
    for c in tried:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    raise FileNotFoundError(
        "gradswitchd not found (tried "
        + ", ".join(str(c) for c in dict.fromkeys(tried))
        + f"); install the gradswitch package with its daemon, or set ${_ENV} to the binary"
    )


_MPI_ENV = "GRADSWITCH_MPI_LIB"


def mpi_library() -> str:
    """Path of libgradswitch_mpi.so: $GRADSWITCH_MPI_LIB if set, else the package's lib/.

    Raises FileNotFoundError (naming what was tried) when there is none: the package was built
    without MPI (CMake found no MPI C headers: apt-get install libopenmpi-dev, then reinstall).
    """
    env = os.environ.get(_MPI_ENV)
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"${_MPI_ENV}={env!r} is not a file")
        return env
    tried = [c.parent.parent / "lib" / "libgradswitch_mpi.so" for c in _candidates()]
    for c in tried:
        if c.is_file():
            return str(c)
    raise FileNotFoundError(
        "libgradswitch_mpi.so not found (tried "
        + ", ".join(str(c) for c in dict.fromkeys(tried))
        + "); the package was built without MPI: install Open MPI's headers (apt-get install "
        f"libopenmpi-dev) and reinstall gradswitch, or set ${_MPI_ENV} to the library"
    )

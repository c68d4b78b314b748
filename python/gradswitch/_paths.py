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

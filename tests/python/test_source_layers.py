"""Which rooms of src/ may include which: the C++ layers, read from the sources' #include lines.

Every source is named by its path from src/ ("switch/engine/engine.h") or from include/ ("gradswitch/
wire.h", the public C headers every layer may use). The daemon (src/switch) and the worker library
(src/worker) share only src/common: the switch links no worker code, and a worker links no daemon code.
The MPI library (src/mpi) is a worker. Inside the worker, the two data paths, the switch's
(src/worker/switch/) and the ring (src/worker/ring/), know nothing of each other: the Group chooses one
(src/worker/path.h's DataPath) and hands a lost switch's allreduces to the ring. Nothing is compiled:
the lines are read as text, so a conditional include counts too.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)

# room (a folder under src/) -> the rooms its sources may include, beside include/gradswitch/.
# The longest matching room of a source decides.
ALLOWED = {
    "common": {"common"},
    "switch": {"common", "switch", "switch/engine", "switch/options"},
    # The engine sees no sockets, options or control plane: only its own headers and common/.
    "switch/engine": {"common", "switch/engine"},
    # The options know the config they fill in and the log, nothing of what reads them.
    "switch/options": {"common", "switch", "switch/options"},
    "worker": {"common", "worker", "worker/switch", "worker/ring"},
    "worker/switch": {"common", "worker", "worker/switch"},
    "worker/ring": {"common", "worker", "worker/ring"},
    "mpi": {"common", "worker", "worker/switch", "worker/ring", "mpi"},
}


def room(path: str) -> str | None:
    """The room of a path from src/ (the longest ALLOWED key it lies in); None for include/gradswitch."""
    if path.startswith("gradswitch/"):
        return None
    best = ""
    for r in ALLOWED:
        if path.startswith(r + "/") and len(r) > len(best):
            best = r
    return best or path.split("/", 1)[0]


def violations(src: Path) -> list[str]:
    """'file: includes "x"' for every include of a room the file's room may not use."""
    out = []
    for f in sorted(src.rglob("*")):
        if f.suffix not in (".h", ".cpp", ".c") or not f.is_file():
            continue
        own = room(f.relative_to(src).as_posix())
        for inc in INCLUDE.findall(f.read_text(errors="replace")):
            target = room(inc)
            if target is not None and target not in ALLOWED.get(own, {own}):
                out.append(f'src/{f.relative_to(src).as_posix()}: includes "{inc}" (room {target})')
    return out


def test_every_room_includes_only_what_its_layer_allows():
    found = violations(SRC)
    assert not found, "includes across the layers:\n" + "\n".join(found)


def test_every_room_of_src_is_known():
    rooms = {p.name for p in SRC.iterdir() if p.is_dir()}
    assert rooms <= {r.split("/")[0] for r in ALLOWED}, f"rooms without a rule: {rooms - set(ALLOWED)}"


def test_the_check_sees_a_daemon_file_that_includes_the_worker(tmp_path):
    # The check itself: a switch source that includes a worker header (as the leaf's uplink timers
    # once included worker/loss_detector.h) is reported, and a worker path the other data path's.
    (tmp_path / "switch" / "uplink").mkdir(parents=True)
    (tmp_path / "switch" / "uplink" / "t.h").write_text('#include "worker/loss_detector.h"\n')
    (tmp_path / "worker" / "ring").mkdir(parents=True)
    (tmp_path / "worker" / "ring" / "r.cpp").write_text(
        '#include "worker/path.h"\n#include "worker/switch/switch_allreduce.h"\n'
    )
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "ok.h").write_text('#include "gradswitch/wire.h"\n#include "common/clock.h"\n')
    assert violations(tmp_path) == [
        'src/switch/uplink/t.h: includes "worker/loss_detector.h" (room worker)',
        'src/worker/ring/r.cpp: includes "worker/switch/switch_allreduce.h" (room worker/switch)',
    ]

"""What the installed package carries for its users' tools: the PEP 561 marker and the extension's
stub beside the extension (the wheel's contents, as installed)."""

from __future__ import annotations

from pathlib import Path

import gradswitch
from gradswitch import _core


def test_the_installed_package_is_marked_typed_and_stubs_its_extension():
    here = Path(gradswitch.__file__).parent
    assert (here / "py.typed").is_file(), f"{here} has no py.typed (PEP 561): type checkers ignore its types"
    assert (Path(_core.__file__).parent / "_core.pyi").is_file(), "the extension's stub is missing"

# `python3 -m gradswitch.testbed ...`: the same as `gradswitch testbed ...` (docs/testbed.md).
import sys

from .cli import main

sys.exit(main(["testbed", *sys.argv[1:]]))

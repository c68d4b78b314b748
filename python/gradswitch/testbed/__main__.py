import sys

from .cli import main

sys.exit(main(["testbed", *sys.argv[1:]]))

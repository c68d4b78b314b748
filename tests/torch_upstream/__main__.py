"""`python -m tests.torch_upstream`: see tests/torch_upstream/_runner.py."""

import sys

if __name__ == "__main__":
    from tests.torch_upstream._runner import main

    sys.exit(main())

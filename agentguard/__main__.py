"""``python -m agentguard``: the ``agentguard`` command, for an environment whose scripts are not on PATH."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m proxy`: the console script (`tollhouse`), for a machine without it on PATH."""

import sys

from proxy.runtime.cli import main

sys.exit(main())

import sys

from proxy.runtime.cli import main

sys.exit(main())

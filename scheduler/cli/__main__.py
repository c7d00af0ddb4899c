"""`python -m scheduler.cli …`: the same as `slotsched …`."""

import sys

from scheduler.cli import main

sys.exit(main())

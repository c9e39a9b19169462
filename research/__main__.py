"""`python -m research <command>`: the laboratory's command line (research/cli/); how its grids start
their units too (research/parallel.py)."""

import sys

from research.cli import main

sys.exit(main())

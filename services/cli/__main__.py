"""`python -m services.cli <command>`: how `openbook up` starts its children, and `bench learning-curve
--parallel` its units."""

import sys

from services.cli import main

sys.exit(main())

"""`python -m services.cli <command>`: how `openbook up` starts its children."""

import sys

from services.cli import main

sys.exit(main())

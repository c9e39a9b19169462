"""`python -m openbook.cli`: the library's commands alone."""

import sys

from openbook.cli import main

sys.exit(main())

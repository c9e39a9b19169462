"""`python -m openbook.cli`: the library's `openbook` command (how `eval --parallel` starts its units)."""

import sys

from openbook.cli import main

sys.exit(main())

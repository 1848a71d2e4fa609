"""`python -m skiplock.cli`: the `skiplock` command."""

import sys

from . import main

sys.exit(main())

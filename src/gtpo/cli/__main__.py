"""`python -m gtpo.cli ...`: the `gtpo` command (what `gtpo compare` launches for each run)."""

import sys

from gtpo.cli.main import main

sys.exit(main())

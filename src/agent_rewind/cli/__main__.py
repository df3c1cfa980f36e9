"""`python -m agent_rewind.cli`: the `agent-rewind` command."""

import sys

from agent_rewind.cli import main

sys.exit(main())

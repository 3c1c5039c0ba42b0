"""``python -m mgprof`` runs the CLI."""

import sys

from mgprof.cli import main

sys.exit(main())

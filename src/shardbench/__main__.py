"""`python -m shardbench` is the `shardbench` command."""

import sys

from shardbench.cli import main

sys.exit(main())

"""`python -m experiments.tables [--check]`: see the package docstring."""

import sys

from experiments.tables import main

sys.exit(main(sys.argv[1:]))

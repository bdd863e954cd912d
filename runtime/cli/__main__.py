"""`python -m opendpu.runtime.cli`: the `opendpu` command."""
import sys

from opendpu.runtime.cli import main

sys.exit(main())

"""`python -m hayakoe_pi.cli ...`: the same as the console script `hayakoe-pi ...`."""

import sys

from .main import main

sys.exit(main())

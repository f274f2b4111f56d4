"""`python -m oncemesh`: the `oncemesh` command."""

import sys

from .cli import main

sys.exit(main())

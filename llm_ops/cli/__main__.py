"""``python -m llm_ops.cli``: the same as ``llm-ops``."""

import sys

from . import main

sys.exit(main())

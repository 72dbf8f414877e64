"""``python -m llm_ops._options_page [PAGE]``: write the tables of the options page
(``docs/reference/options.md``) again from the declared settings, keeping its prose."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ._parameters import options_page

OPTIONS_PAGE = Path("docs") / "reference" / "options.md"


def main(argv: Sequence[str]) -> int:
    page = Path(argv[0]) if argv else OPTIONS_PAGE
    page.write_text(options_page(page.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``python -m shuniu.core`` runs the ``shuniu`` command line."""

from shuniu.core.cli import main

main()

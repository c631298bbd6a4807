"""``python -m shuniu.core`` runs the ``shuniu`` command line."""

from shuniu.core.cli import main

if __name__ == "__main__":  # not when a spawned worker process (capacity models) imports it
    main()

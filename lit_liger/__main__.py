"""``python -m lit_liger ...`` is the ``lit-liger`` command (Lightning relaunches it this way too)."""

from lit_liger.cli import main

if __name__ == "__main__":
    main()

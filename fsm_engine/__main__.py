"""``python -m fsm_engine`` runs the ``fsm`` command line."""

from .cli import main

if __name__ == "__main__":
    main()

"""``python -m fsm_engine`` runs the ``fsm`` command line."""

from .cli import entry

if __name__ == "__main__":
    entry()

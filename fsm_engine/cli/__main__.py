"""``python -m fsm_engine.cli``: the ``fsm`` command."""

from fsm_engine.cli import main

main()

"""``python -m fsm_engine.cli``: the ``fsm`` command."""

from fsm_engine.cli import main

if __name__ == "__main__":  # importing the module (tests/test_public_api.py) runs nothing
    main()

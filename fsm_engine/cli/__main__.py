"""``python -m fsm_engine.cli``: the ``fsm`` command."""

if __name__ == "__main__":
    from fsm_engine.cli import entry

    entry()

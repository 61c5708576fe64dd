"""The kinds of step beyond a plain action: fan-out (start, top up, join) and the
families run here, reviews (the queue, the SLA timer, signed links, the webhook), pauses,
agent states (turns, tool calls, approvals), forks, replay and migrations.

Each module builds commits for the core (``runtime.outcome``, ``runtime.ledger``) and
reads the core's values; the driver and the runner dispatch to them.
"""

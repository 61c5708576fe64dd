"""The fleet: what many workers share through the store. A worker's identity, liveness
and lease (``liveness``, ``ownership``), the queues it serves (``queues``), the fleet's
stored limits (``limits``), rate limits and circuit breakers per model (``rates``,
``breaker``). The long-running worker that serves them (``fsm worker``) stands above the
engine, in ``runtime.worker``.
"""

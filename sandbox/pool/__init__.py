"""The service's pool of sandbox workers and the typed requests it makes of them.

A backend only knows how to start one worker (a process, a container) and hand back a
``Channel`` (``worker``); the pool owns everything else: handshakes, loading environment classes
once per worker, guard timeouts, replacing broken workers and recycling old ones, so every
backend behaves the same (``workers``). ``requests`` holds the requests the service makes
(``WorkerPool``), ``calls`` what they take and give back.
"""

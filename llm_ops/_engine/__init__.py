"""The engine: requests to one OpenAI-compatible endpoint, sent concurrently and retried.

A :class:`~llm_ops.Client` holds one engine for its life; every job borrows it. The parts,
from the wire up: ``boundary`` (where the sockets' and the SDK's errors become ours, and what
is redacted), ``transport`` (the hot path's HTTP/1.1: a pool of keep-alive connections,
bounded reads),
``answers`` (what an answer says: statuses, ``Retry-After``, usage, parsing), ``engine``
(the endpoint, its pool and limiter, the models it lists) and ``dispatcher`` (workers over
a stream of requests, each retried in one place and reported as one outcome).
"""

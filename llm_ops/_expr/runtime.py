"""Which client an expression runs on, and where its batches run: each client lends its
expressions one event loop, driven by the thread Polars called, and its own engine.

Polars calls a batch function on whichever thread evaluates the expression: the caller's
thread, a streaming thread, or one of its own pool's worker threads (several expressions
of one eager context, group_by().agg, ...). The pipeline uses Polars throughout, and Polars
work started from another thread waits for a free pool worker; when every worker waits in
a batch function, none ever is (with two cores, two llm expressions in one with_columns).
So a batch does not hop to the client's own loop thread: the thread Polars called drives an
event loop of the client's expressions itself and runs the pipeline's work in place (where
a pool worker runs nested Polars work itself). The journal's merges (which wait for the
cache file) and host name lookups go to a thread, and each attempt to send a request goes to
the client's loop, where its engine lives (:meth:`Engine.hosted
<llm_ops._engine.engine.Engine.hosted>`): an expression and the client's ``complete`` calls
share one connection pool, one rate limiter and one adaptive concurrency. Only the network
waits there for an expression, never Polars work. (The client's own frame jobs do run
Polars work on its loop: a ``complete`` call running on another thread at the same time as
a query whose expressions fill Polars' thread pool, on the same client, can deadlock, the
call's Polars work waiting for a pool worker and the workers for the client's loop. Give
such a concurrent query a client of its own.)
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, cast

from .._client import Client, given_client, shared_key
from .._in_place import runs_in_place
from .._options import ClientOptions
from .._pipeline.backend import Backend
from .._signals import graceful_sigterm

P = ParamSpec("P")
T = TypeVar("T")

SHARED_CLIENTS = 8
"""How many shared clients (one per set of options) a process keeps: a loop making
expressions of ever new options (an endpoint per row of a config table) does not pile up
connection pools and loop threads without end."""

_clients: collections.OrderedDict[str, Client] = collections.OrderedDict()  # least recent first
_retired: list[Client] = []  # evicted while an expression still held them: closed once none does
_users: weakref.WeakKeyDictionary[Client, weakref.WeakSet[object]] = weakref.WeakKeyDictionary()
_runtimes: weakref.WeakKeyDictionary[Client, Runtime] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def client_for(client: Client | None, made: ClientOptions, *, user: object = None) -> Client:
    """``client``, or the process's shared client for ``made`` (one per set of options and
    environment), so every batch and every expression with the same options share one pool,
    one rate limiter and what was learned about the endpoint.

    The shared clients are the :data:`SHARED_CLIENTS` most recently asked for; an evicted one
    is closed once no ``user`` (the expression it was given to) is alive, never under one."""
    if client is not None:
        return given_client(client, made)
    key = shared_key(made)
    with _lock:
        shared = _clients.get(key)
        if shared is None:
            shared = _clients[key] = Client(**made)
        _clients.move_to_end(key)
        if user is not None:
            _users.setdefault(shared, weakref.WeakSet()).add(user)
        while len(_clients) > SHARED_CLIENTS:
            _retired.append(_clients.popitem(last=False)[1])
        unused = _take_unused_retired()
    for evicted, runtime in unused:
        _close(evicted, runtime)
    return shared


def _take_unused_retired() -> list[tuple[Client, Runtime | None]]:
    """The evicted clients no expression holds and no batch runs on, with their runtimes,
    taken out of :data:`_retired` (under :data:`_lock`)."""
    unused = [
        client
        for client in _retired
        if not _users.get(client) and not _running(_runtimes.get(client))
    ]
    for client in unused:
        _retired.remove(client)
    return [(client, _runtimes.pop(client, None)) for client in unused]


def _running(runtime: Runtime | None) -> bool:
    return runtime is not None and runtime.lock.locked()


def _close(client: Client, runtime: Runtime | None) -> None:
    """Close an evicted shared client: its expressions' loop, its connection pool and its
    loop thread."""
    with contextlib.suppress(Exception):  # closing frees what it can; the caller wants a client
        if runtime is None or runtime.close(wait=0):
            client.close()


def runtime_of(client: Client) -> Runtime:
    with _lock:
        runtime = _runtimes.get(client)
        if runtime is None:
            runtime = _runtimes[client] = Runtime(client)
        return runtime


def close_runtimes() -> None:
    """Close every runtime (at exit), and the shared clients whose expressions are done:
    their connections are closed on their loops."""
    with _lock:
        runtimes = dict(_runtimes.items())
        shared = [*_clients.values(), *_retired]
        _clients.clear()
        _retired.clear()
    for client, runtime in runtimes.items():
        closed = False
        with contextlib.suppress(Exception):  # a loop still running on a killed thread
            closed = runtime.close()
        if closed and client in shared:
            with contextlib.suppress(Exception):
                client.close()


class InPlace(concurrent.futures.ThreadPoolExecutor):
    """The default executor of a runtime's loop: the pipeline's work marked
    :func:`~llm_ops._in_place.in_place` (its ``asyncio.to_thread`` calls) runs on the thread
    driving the loop, the rest on a small thread pool."""

    def __init__(self) -> None:
        super().__init__(4, thread_name_prefix="llm-ops")

    def submit(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> concurrent.futures.Future[T]:
        if not runs_in_place(fn):
            return super().submit(fn, *args, **kwargs)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


class Runtime:
    """What the expressions of one client share: an event loop driven by the thread Polars
    called, for the client's life; their requests go out on the client's engine (connection
    pool, rate limiter, adaptive concurrency), on the client's loop. One batch at a time:
    hold :attr:`lock` around :meth:`run`."""

    def __init__(self, client: Client):
        self.client = client
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(InPlace())

    async def backend(self) -> Backend:
        """The client's cache, made ready here (in place), and the engine the client lends
        this loop, made ready before anything is paid for."""
        if self.client.cache is not None:
            self.client.cache.prepare()
        return Backend(await self.client.lend_engine(), self.client.cache)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on this loop from this thread (from a helper thread where this
        thread already runs a loop, as a notebook's does); Ctrl-C cancels it and waits until
        what was answered is cached, and SIGTERM drains it, as in :meth:`Client.run`."""
        task = self.loop.create_task(coroutine)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            with graceful_sigterm():
                return self._drive(task)
        outcome: list[Any] = []

        def drive() -> None:
            try:
                outcome.append(self._drive(task))
            except BaseException as exc:
                outcome.append(exc)

        helper = threading.Thread(target=drive, name="llm-ops-expression", daemon=True)
        helper.start()
        try:
            while helper.is_alive():
                helper.join(0.1)
        except KeyboardInterrupt:
            self.loop.call_soon_threadsafe(task.cancel)
            helper.join()
            raise
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return cast(T, outcome[0])

    def _drive(self, task: asyncio.Task[T]) -> T:
        try:
            return self.loop.run_until_complete(task)
        except KeyboardInterrupt:
            task.cancel()
            with contextlib.suppress(BaseException):
                self.loop.run_until_complete(task)
            raise

    def close(self, *, wait: float = 5.0) -> bool:
        """Close the loop, unless a batch still runs after ``wait`` seconds (at exit: a query
        a signal stopped on another thread); whether it was closed. The engine is the
        client's, closed with it."""
        if not self.lock.acquire(timeout=wait):
            return False
        try:
            self.loop.close()
            return True
        finally:
            self.lock.release()

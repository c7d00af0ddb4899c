"""The blocking SDK for threaded runtimes: the asyncio SDK run on a private event loop.

Why not a second implementation on grpc's blocking stubs: the session logic (stream
re-attach, TTL/3 renewals, the yield path, release on exit) is the subtle part, and two copies
would drift. Instead each `Client` owns one event loop in a daemon thread and drives an
`AsyncClient` on it; every blocking method submits a coroutine to that loop and waits for its
result, so behaviour is identical to the async SDK by construction. The daemon thread never
keeps the interpreter alive; a process that dies without releasing simply stops renewing, and
the lease expires after its TTL.

Callbacks (`on_yield`, `on_grant`) given as plain functions run in the loop's worker threads, so
they may block; they must not call back into the same `Client` synchronously from the loop
thread itself (a coroutine callback would), which would deadlock and is refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, Self, TypeVar

from scheduler.client.aio import (
    AsyncClient,
    AsyncSession,
    OnGrant,
    OnYield,
    OnYieldCancelled,
)
from scheduler.client.channel import tls_credentials
from scheduler.client.errors import SlotschedError
from scheduler.client.forward import Forward
from scheduler.client.options import ClientOptions
from scheduler.client.permit import OnPermitQueued, Permit, PermitQueue, Settled
from scheduler.client.phases import Phase
from scheduler.client.types import LeaseInfo, QoS, QueueInfo, SessionInfo, Slot, SnapshotRef

T = TypeVar("T")


class Client:
    """A connection to the slotsched Scheduler for threaded code; the same arguments as
    `AsyncClient` (a `ClientOptions`, or its names as keyword arguments; a test compares the two
    signatures), passed on to the one it drives."""

    def __init__(
        self,
        target: str | Sequence[str],
        token: str | None = None,
        tenant: str | None = None,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        *,
        options: ClientOptions | None = None,
        **settings: Any,
    ) -> None:
        # Refused (a bad setting) before the loop thread starts: nothing to clean up.
        o = ClientOptions.of(options, settings, token=token, tenant=tenant, channel_options=channel_options)
        # The files are read (or refused) here, in the caller's thread.
        credentials = tls_credentials(o.tls_ca, o.tls_cert, o.tls_key, o.credentials)
        o = replace(o, credentials=credentials, tls_ca=None, tls_cert=None, tls_key=None)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="slotsched-client", daemon=True)
        self._thread.start()
        self._closed = False
        self._aclient = AsyncClient(target, options=o)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the client's loop and wait for its result (cancelling it if interrupted)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("blocking slotsched Client call from its own event loop thread")
        if self._closed:
            coro.close()
            raise RuntimeError("Client is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"slotsched call did not finish within {timeout}s") from None
        except BaseException:
            fut.cancel()  # e.g. KeyboardInterrupt: stop (and clean up) the coroutine too
            raise

    @property
    def aio(self) -> AsyncClient:
        """The underlying AsyncClient (lives on the private loop; use only via `run`)."""
        return self._aclient

    def session(
        self,
        session_id: str,
        qos: QoS | str = QoS.BURSTABLE,
        on_yield: OnYield | None = None,
        on_grant: OnGrant | None = None,
        resume_from: SnapshotRef | None = None,
        wait_timeout_s: float | None = None,
        on_yield_cancelled: OnYieldCancelled | None = None,
        *,
        pool: str = "",
        selector: Mapping[str, str] | None = None,
        fallback: Sequence[str] = (),
    ) -> Session:
        """A session handle; `with` it to acquire (see `Session`). `on_yield_cancelled` runs on
        the client's loop thread and must not block (see `scheduler.client.session`). `pool`,
        `selector` and `fallback` say where it may run (see `AsyncClient.session`)."""

        async def make() -> AsyncSession:
            return self._aclient.session(
                session_id,
                qos,
                on_yield=on_yield,
                on_grant=on_grant,
                resume_from=resume_from,
                wait_timeout_s=wait_timeout_s,
                on_yield_cancelled=on_yield_cancelled,
                pool=pool,
                selector=selector,
                fallback=fallback,
            )

        return Session(self, self.run(make()))

    def get_session(self, session_id: str, *, pool: str = "") -> SessionInfo:
        """Read a session's state without attaching to it (GetSession; `pool`: as
        `AsyncClient.get_session`)."""
        return self.run(self._aclient.get_session(session_id, pool=pool))

    def close(self) -> None:
        """Release every live session (best effort), close the channel and stop the loop thread."""
        if self._closed:
            return
        try:
            self.run(self._aclient.close())
        finally:
            with contextlib.suppress(Exception):  # e.g. interrupted: the loop stops all the same
                self.run(_drain(), timeout=5.0)
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5.0)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


async def _drain() -> None:
    """End what is left on the client's loop before it stops, as `asyncio.run` does: grpc's own
    tasks (a call's status handler) outlive the channel's close by a turn of the loop, and a loop
    stopped under them printed `Task was destroyed but it is pending!` at the script's exit."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


class Session:
    """The blocking twin of `AsyncSession`: `with client.session(...) as lease:`.

    Attributes read the live async session; `lost_lease` and `ended` are `threading.Event`s
    mirroring the async ones.
    """

    def __init__(self, client: Client, asession: AsyncSession) -> None:
        self._client = client
        self._a = asession
        self.session_id = asession.session_id
        self.qos = asession.qos
        self.lost_lease = threading.Event()
        self.ended = threading.Event()
        asession.add_listener(self._mirror)

    def _mirror(self) -> None:
        # Runs in the loop thread after every state change.
        if self._a.lost_lease.is_set():
            self.lost_lease.set()
        else:
            self.lost_lease.clear()
        if self._a.ended.is_set():
            self.ended.set()

    @property
    def aio(self) -> AsyncSession:
        return self._a

    # Read-only, live views of the async session's state (see `Forward`).
    phase = Forward[Phase]("aio")
    lease = Forward[LeaseInfo | None]("aio")
    queue = Forward[QueueInfo | None]("aio")
    resume_from = Forward[SnapshotRef | None]("aio")
    yields = Forward[int]("aio")
    yields_cancelled = Forward[int]("aio")
    grants = Forward[int]("aio")
    reattaches = Forward[int]("aio")
    error = Forward[SlotschedError | None]("aio")
    end_reason = Forward[str | None]("aio")
    renew_error = Forward[SlotschedError | None]("aio")
    release_error = Forward[SlotschedError | None]("aio")
    lease_id = Forward[str | None]("aio")  # these four: None while `.lease` is
    epoch = Forward[int | None]("aio")
    worker_address = Forward[str | None]("aio")
    slot = Forward[Slot | None]("aio")
    #: The pool of the lease, or of the queue it waits in (None before the server says).
    pool = Forward[str | None]("aio")

    @property
    def callback_errors(self) -> list[BaseException]:
        return list(self._a.callback_errors)

    def start(self) -> None:
        """Open the Acquire stream in the background (then poll `.queue`, `wait_granted()`)."""

        async def go() -> None:
            self._a.start()

        self._client.run(go())

    def wait_granted(self, timeout: float | None = None) -> LeaseInfo:
        """Block until the session holds a lease (see `AsyncSession.wait_granted`)."""
        return self._client.run(self._a.wait_granted(timeout))

    def wait_until(self, predicate: Callable[[Session], bool], timeout: float | None = None) -> None:
        """Block until `predicate(self)` holds; TimeoutError after `timeout` seconds."""
        self._client.run(self._a.wait_until(lambda _a: predicate(self), timeout))

    def permit(
        self,
        budget: str,
        estimate: Any,
        *,
        on_queued: OnPermitQueued | None = None,
        timeout_s: float | None = None,
    ) -> SyncPermit:
        """The blocking twin of `AsyncSession.permit`: `with session.permit(...) as p:` around the
        call, then `p.settle(response)`; `on_queued` runs on the client's loop thread."""
        return SyncPermit(
            self._client, self._a.permit(budget, estimate, on_queued=on_queued, timeout_s=timeout_s)
        )

    def release(self) -> None:
        """Release the lease or withdraw the queued request (raises typed errors)."""
        self._client.run(self._a.release())

    def __enter__(self) -> Self:
        self._client.run(self._a.__aenter__())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._client.run(self._a.__aexit__(exc_type, exc, tb))


class SyncPermit:
    """The blocking twin of `client.permit.Permit`."""

    def __init__(self, client: Client, apermit: Permit) -> None:
        self._client = client
        self.aio = apermit

    @property
    def permit_id(self) -> str | None:
        return self.aio.permit_id

    @property
    def queue(self) -> PermitQueue | None:
        return self.aio.queue

    def settle(self, usage: Any, headers: Any = None) -> Settled:
        return self._client.run(self.aio.settle(usage, headers))

    def throttled(
        self, retry_after_s: float | None = None, usage: Any = None, headers: Any = None
    ) -> Settled:
        return self._client.run(self.aio.throttled(retry_after_s, usage, headers))

    def withdraw(self) -> None:
        self._client.run(self.aio.withdraw())

    def __enter__(self) -> Self:
        self._client.run(self.aio.request())
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._client.run(self.aio.__aexit__(exc_type, exc, tb))

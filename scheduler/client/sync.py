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
import threading
from collections.abc import Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, Generic, Never, Self, TypeVar, overload

import grpc

from scheduler.client.aio import (
    DEFAULT_CONNECT_TIMEOUT_S,
    AsyncClient,
    AsyncSession,
    OnGrant,
    OnYield,
    OnYieldCancelled,
)
from scheduler.client.channel import PemSource, tls_credentials
from scheduler.client.errors import SlotschedError
from scheduler.client.types import LeaseInfo, Phase, QoS, QueueInfo, SessionInfo, Slot, SnapshotRef

T = TypeVar("T")


class _Forward(Generic[T]):
    """A read-only attribute of `Session` that reads the same attribute of its async session, live
    (one line per name instead of a hand-written property each)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _Forward[T]: ...
    @overload
    def __get__(self, obj: Session, owner: type | None = None) -> T: ...
    def __get__(self, obj: Session | None, owner: type | None = None) -> _Forward[T] | T:
        if obj is None:
            return self
        value: T = getattr(obj.aio, self._name)
        return value

    def __set__(self, obj: Session, value: Never) -> None:
        # Read-only like a property: the state belongs to the async session.
        raise AttributeError(f"{self._name} of a Session is read-only")


class Client:
    """A connection to the slotsched Scheduler for threaded code; same arguments as `AsyncClient`."""

    def __init__(
        self,
        target: str | Sequence[str],
        token: str | None = None,
        tenant: str | None = None,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        tls_ca: PemSource | None = None,
        tls_cert: PemSource | None = None,
        tls_key: PemSource | None = None,
        rpc_timeout_s: float = 10.0,
        reattach_timeout_s: float = 30.0,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 2.0,
        renew_interval_s: float | None = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> None:
        if connect_timeout_s <= 0:  # before the loop thread starts: nothing to clean up
            raise ValueError(f"connect_timeout_s must be > 0, not {connect_timeout_s!r}")
        credentials = tls_credentials(tls_ca, tls_cert, tls_key, credentials)  # files read (or refused) here
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="slotsched-client", daemon=True)
        self._thread.start()
        self._closed = False
        self._aclient = AsyncClient(
            target,
            token=token,
            tenant=tenant,
            channel_options=channel_options,
            credentials=credentials,
            rpc_timeout_s=rpc_timeout_s,
            reattach_timeout_s=reattach_timeout_s,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            renew_interval_s=renew_interval_s,
            connect_timeout_s=connect_timeout_s,
        )

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
    ) -> Session:
        """A session handle; `with` it to acquire (see `Session`). `on_yield_cancelled` runs on
        the client's loop thread and must not block (see `scheduler.client.session`)."""

        async def make() -> AsyncSession:
            return self._aclient.session(
                session_id,
                qos,
                on_yield=on_yield,
                on_grant=on_grant,
                resume_from=resume_from,
                wait_timeout_s=wait_timeout_s,
                on_yield_cancelled=on_yield_cancelled,
            )

        return Session(self, self.run(make()))

    def get_session(self, session_id: str) -> SessionInfo:
        """Read a session's state without attaching to it (GetSession)."""
        return self.run(self._aclient.get_session(session_id))

    def close(self) -> None:
        """Release every live session (best effort), close the channel and stop the loop thread."""
        if self._closed:
            return
        try:
            self.run(self._aclient.close())
        finally:
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

    # Read-only, live views of the async session's state (see `_Forward`).
    phase = _Forward[Phase]()
    lease = _Forward[LeaseInfo | None]()
    queue = _Forward[QueueInfo | None]()
    resume_from = _Forward[SnapshotRef | None]()
    yields = _Forward[int]()
    yields_cancelled = _Forward[int]()
    grants = _Forward[int]()
    reattaches = _Forward[int]()
    error = _Forward[SlotschedError | None]()
    end_reason = _Forward[str | None]()
    lease_id = _Forward[str | None]()  # these four: None while `.lease` is
    epoch = _Forward[int | None]()
    worker_address = _Forward[str | None]()
    slot = _Forward[Slot | None]()

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

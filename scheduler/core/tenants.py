"""Per-tenant accounting: what a tenant holds and waits for, by class, and its weighted share.

Class indexes (G, B, BE) are small ints because this is the hot path of every decision.
`borrowed` is what a tenant holds beyond what it can count on: Burstable leases beyond its
nominal plus all BestEffort leases (DESIGN.md, "Who gets the next free slot", rule 3).

Which Burstable leases are borrowing is decided per lease at grant time: beyond the nominal, or
within it but on a floor slot the floor could not spare (DESIGN.md lends idle floor only to
preemptible work; such a lease is lent as borrowing, and promoted to nominal when a nominal
lease of the tenant ends and the floor allows).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from scheduler.core.types import LeaseId, QoS, SessionId
from scheduler.core.views import TenantView
from scheduler.policy.model import TenantSpec

G, B, BE = 0, 1, 2
CLASSES: tuple[QoS, QoS, QoS] = (QoS.GUARANTEED, QoS.BURSTABLE, QoS.BEST_EFFORT)
CLASS_INDEX: dict[QoS, int] = {q: i for i, q in enumerate(CLASSES)}

# A queue entry: (arrival, seq, session). Arrival is the original arrival, kept across yields.
QueueEntry = tuple[float, int, SessionId]


def weighted_share(borrowed: float, weight: float) -> float:
    """The weighted share: slots held beyond what the tenant can count on (Burstable beyond its
    nominal plus BestEffort; DESIGN.md, "Who gets the next free slot"), plus its recent usage
    in slots (`TenantState.usage_slots`, 0 unless spec.fairness has a usage half-life), per unit
    of weight. The one definition: the order of service, the victim order and the views use it."""
    return borrowed / weight


def share_at_most(borrowed_a: float, weight_a: float, borrowed_b: float, weight_b: float) -> bool:
    """`weighted_share(borrowed_a, weight_a) <= weighted_share(borrowed_b, weight_b)`,
    cross-multiplied so that equal shares compare equal exactly (no rounding of a division)."""
    return borrowed_a * weight_b <= borrowed_b * weight_a


@dataclass(slots=True, eq=False)  # identity: tenants key the dirty sets
class TenantState:
    spec: TenantSpec
    # Leases held per class, including those asked to yield (they still hold their slot).
    held: list[int] = field(default_factory=lambda: [0, 0, 0])
    yielding: list[int] = field(default_factory=lambda: [0, 0, 0])
    b_borrowing: int = 0  # Burstable leases held as borrowing (preemptible)
    b_borrowing_yielding: int = 0
    # Waiting requests per class, and how many of them have a victim yielding for them.
    waiting: list[int] = field(default_factory=lambda: [0, 0, 0])
    earmarked: list[int] = field(default_factory=lambda: [0, 0, 0])
    earmarked_fair: int = 0
    queues: list[list[QueueEntry]] = field(default_factory=lambda: [[], [], []])
    # Preemption candidates (active, not yielding, on a ready worker): lease -> granted_at, in
    # grant order, so the newest (least work lost) is `next(reversed(d))`.
    candidates: list[dict[LeaseId, float]] = field(default_factory=lambda: [{}, {}, {}])
    # Candidates that have run min_runtime: only these can be fairness victims.
    mature: list[dict[LeaseId, float]] = field(default_factory=lambda: [{}, {}, {}])
    # Per class, the candidates (and the mature ones) as a lazy heap in the order a tenant's
    # leases are asked to yield (`victims.session_key`); an entry stands while its lease is in
    # the matching dict above.
    pick: list[list[tuple[int, int, LeaseId]]] = field(default_factory=lambda: [[], [], []])
    mpick: list[list[tuple[int, int, LeaseId]]] = field(default_factory=lambda: [[], [], []])
    # Per class, the grant seq up to which `candidates` have their entry in `pick`: the leases
    # granted since are pushed when it is next read (`victims.first_pick`).
    pushed: list[int] = field(default_factory=lambda: [0, 0, 0])
    version: int = 0  # of its entries in the order-of-service heaps
    vversion: int = 0  # of its entries in the victim heaps
    preemptible_contrib: int = 0  # borrowed slots held (yielding included) since `usage_at`
    # Fair share over time (spec.fairness): borrowed slot-seconds decayed at each sample, the
    # slot-seconds since the last sample, and the usage as slots (usage / min runtime) the share
    # adds. `last_preempted`: the preemption seq of its last lease asked to yield (victim ties).
    usage: float = 0.0
    usage_acc: float = 0.0
    usage_at: float = 0.0
    usage_slots: float = 0.0
    last_preempted: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    def quota(self, cls: int) -> int | None:
        """Most leases the tenant may hold in a class; None means no cap."""
        if cls == G:
            return self.spec.guaranteed
        if cls == B:
            return self.spec.burstable_limit
        return self.spec.best_effort_limit

    def class_allowed(self, cls: int) -> bool:
        q = self.quota(cls)
        return q is None or q > 0

    def view(self) -> TenantView:
        return TenantView(
            self.name,
            self.spec.weight,
            (self.held[0], self.held[1], self.held[2]),
            (self.waiting[0], self.waiting[1], self.waiting[2]),
            self.borrowed_effective(),
            self.share(),
            self.spec.guaranteed,
            self.spec.burstable_nominal,
            self.spec.burstable_limit,
            self.spec.best_effort_limit,
        )

    def preemptible(self) -> int:
        """Leases of this tenant that can be taken back (counted by the floor invariant)."""
        return self.b_borrowing + self.held[BE]

    def borrowed_effective(self) -> int:
        """Borrowed leases not already on their way out (yielding ones are gone for fairness)."""
        return self.b_borrowing - self.b_borrowing_yielding + self.held[BE] - self.yielding[BE]

    def borrowed_b_effective(self) -> int:
        return self.b_borrowing - self.b_borrowing_yielding

    def b_nominal_held(self) -> int:
        return self.held[B] - self.b_borrowing

    def share(self, in_flight: int = 0) -> float:
        """Its weighted share, counting `in_flight` more borrowed slots (fairness yields already
        under way for it, when ranking it in the order of service)."""
        return weighted_share(self.borrowed_effective() + in_flight + self.usage_slots, self.spec.weight)

    def pending(self) -> int:
        return self.waiting[G] + self.waiting[B] + self.waiting[BE]

    def push_request(self, cls: int, entry: QueueEntry) -> None:
        heapq.heappush(self.queues[cls], entry)

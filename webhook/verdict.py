"""What the admission decision comes to: allowed or not, the patch, the message, and what it saw."""

from __future__ import annotations

from dataclasses import dataclass, field

from raygate.core.keys import Mode
from raygate.core.patch import PatchOp
from raygate.core.workload import Gang


@dataclass(frozen=True)
class Decision:
    allowed: bool
    outcome: str  # for metrics and logs: mutated, unchanged, skipped-*, refused, denied
    patch: list[PatchOp] = field(default_factory=list)
    message: str | None = None
    code: int | None = None
    warnings: list[str] = field(default_factory=list)
    gang: Gang | None = None
    mode: Mode | None = None


def allow(outcome: str, message: str | None = None) -> Decision:
    return Decision(allowed=True, outcome=outcome, message=message)


def refuse(message: str, *, code: int = 422, mode: Mode | None = None) -> Decision:
    return Decision(allowed=False, outcome="refused", message=message, code=code, mode=mode)

"""A benchmark side spelled `raygate@<git ref>`: raygate as of that ref, on the same stack as today's.

The ref is exported once (`git archive <sha> | tar -x`: no worktree is registered and this checkout is left
alone) into <raygate's cache>/baseline-<full sha>/ and reused by every later run. Its webhook and reconciler run
from there (raygate_local's `source`: PYTHONPATH=<that tree>, its own RBAC and webhook registration), with this
tree's stack, jobs, watches and accounting around them.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import REPO, BenchError

RAYGATE = "raygate"
# raygate installed as one process (`raygate serve`): it runs and counts as raygate, its reconciler in the
# webhook's process.
RAYGATE_SERVE = "raygate-serve"
VARIANTS = {RAYGATE_SERVE: RAYGATE}


def split_side(side: str) -> tuple[str, str | None]:
    """("raygate", "1e155ff") for "raygate@1e155ff"; (side, None) for a side without a ref."""
    base, at, ref = side.partition("@")
    return base, (ref if at else None)


def base_side(side: str) -> str:
    """The side a `side@ref` (or raygate-serve) is a version of: what it runs and counts as ("raygate")."""
    base = split_side(side)[0]
    return VARIANTS.get(base, base)


def check_sides(sides: list[str], known: tuple[str, ...]) -> list[str]:
    """`sides` as given, checked: each a known side, or raygate@<ref>; ordered as `known`, each ref after its
    side in the order given."""
    for side in sides:
        base, ref = split_side(side)
        if base_side(side) not in known or ref == "" or (ref is not None and base != RAYGATE):
            names = [*known, *(v for v, b in VARIANTS.items() if b in known)]
            raise BenchError(f"unknown side {side!r}: expected one of {', '.join(names)} or {RAYGATE}@<git ref>")
    unique = list(dict.fromkeys(sides))
    return sorted(unique, key=lambda s: (known.index(base_side(s)), "@" in s, split_side(s)[0] in VARIANTS,
                                         unique.index(s)))


def full_sha(ref: str) -> str:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                         capture_output=True, text=True, check=False, timeout=30)
    if out.returncode != 0:
        raise BenchError(f"{ref!r} names no commit in {REPO}")
    return out.stdout.strip()


def checkout(ref: str, cache: Path | None = None) -> Path:
    """The tree of `ref`, exported once into <cache>/baseline-<full sha> (raygate's cache by default) and reused."""
    from raygate.devenv.versions import cache_root

    sha = full_sha(ref)
    root = cache or cache_root()
    target = root / f"baseline-{sha}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".baseline-{sha[:12]}-", dir=root))
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", sha], capture_output=True, check=True,
                                 timeout=120)
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, capture_output=True, check=True,
                       timeout=120)
        tmp.rename(target)  # whole or not at all: a run cut short leaves no half tree to reuse
    except (subprocess.CalledProcessError, OSError) as err:
        if target.is_dir():  # another run exported it meanwhile
            return target
        raise BenchError(f"could not export {ref} ({sha}) into {target}: {err}") from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"bench: raygate@{ref} exported to {target}", flush=True)
    return target

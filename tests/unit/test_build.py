"""The pure parts of `make cluster-bins`: which binaries a build makes, and a dependency built with
files added to a copy of its pinned version (Volcano's apis)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from raygate.core.errors import RaygateError
from raygate.devenv import build


def test_every_binary_the_bundle_needs_has_a_build() -> None:
    made = {name for w in build._builds() for name in w.outputs}
    assert set(build.BINARIES) <= made


def test_volcano_binaries_are_named_apart_from_kube_scheduler() -> None:
    volcano = next(w for w in build._builds() if w.name == "volcano")
    assert volcano.outputs == ["vc-scheduler", "vc-controller-manager"]


@pytest.fixture
def module_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A read-only module directory, as `go mod download` leaves it."""
    src = tmp_path / "cache" / "mod@v1"
    (src / "pkg").mkdir(parents=True)
    (src / "go.mod").write_text("module example.com/mod\n")
    (src / "pkg" / "types.go").write_text("package pkg\n")
    for path in (src / "pkg" / "types.go", src / "go.mod", src / "pkg", src):
        path.chmod(0o555 if path.is_dir() else 0o444)
    monkeypatch.setattr(build, "download_module", lambda module, version, work: src)
    return src


def test_additions_go_into_a_writable_copy_and_the_cache_is_left_alone(tmp_path: Path, module_cache: Path) -> None:
    wdir = tmp_path / "wrapper"
    wdir.mkdir()
    copy = build._with_additions("example.com/mod", "v1", {"pkg/added.go": "package pkg\n"}, tmp_path, wdir)
    assert copy.parent == wdir
    assert (copy / "pkg" / "added.go").read_text() == "package pkg\n"
    assert (copy / "pkg" / "types.go").exists()
    assert not (module_cache / "pkg" / "added.go").exists()


def test_an_addition_never_overwrites_what_the_module_has(tmp_path: Path, module_cache: Path) -> None:
    with pytest.raises(RaygateError, match=r"already has pkg/types\.go"):
        build._with_additions("example.com/mod", "v1", {"pkg/types.go": "package pkg\n"}, tmp_path, tmp_path)


def test_the_volcano_scheduler_configuration_runs_what_the_docs_say() -> None:
    import yaml

    from raygate.devenv.volcano import SCHEDULER_CONF, scheduler_args

    conf = yaml.safe_load(SCHEDULER_CONF.read_text())
    assert [a.strip() for a in conf["actions"].split(",")] == ["enqueue", "allocate", "backfill"]
    plugins = [p["name"] for tier in conf["tiers"] for p in tier["plugins"]]
    assert {"gang", "proportion", "predicates", "nodeorder"} <= set(plugins)
    assert plugins.index("gang") < len(conf["tiers"][0]["plugins"]), "gang decides in the first tier"

    plane = SimpleNamespace(kubeconfig="/k", bundle=SimpleNamespace(binary=lambda name: f"/bin/{name}"))
    args = scheduler_args(plane)  # type: ignore[arg-type]
    assert f"--scheduler-conf={SCHEDULER_CONF}" in args and "--leader-elect=false" in args

"""`make cluster-bins`: build the control-plane binaries and collect the CRDs from pinned Go modules.

Each upstream is built through a small wrapper module (`go get pkg@version`, then `go build`), so
no upstream source is copied into this repository. For k8s.io/kubernetes the wrapper carries
`replace` directives that pin every k8s.io staging module to the matching tag.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from raygate.core.errors import RaygateError
from raygate.devenv import versions as v

KUEUE_METRICS_CERT_DIR_ENV = "RAYGATE_KUEUE_METRICS_CERT_DIR"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "kuberay-operator", "kueue",
            "kube-scheduler", "kwok", "cluster-autoscaler", "helm", "vc-scheduler", "vc-controller-manager")


@dataclass(frozen=True)
class Bundle:
    """Where one built set of binaries and CRDs lives."""

    root: Path

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def crd_dir(self) -> Path:
        return self.root / "crds"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def complete(self) -> bool:
        return self.built and not self.missing

    @property
    def built(self) -> bool:
        return (self.root / "COMPLETE").exists()

    @property
    def missing(self) -> list[str]:
        return [b for b in BINARIES if not self.binary(b).exists()]


@dataclass
class _GoBuild:
    """Binaries from one pinned Go module: by default through a wrapper go.mod that requires it."""

    name: str
    module: str
    version: str
    packages: list[str]
    staging_replaces: bool = False  # k8s.io/kubernetes: point its staging modules at their tags
    ldflags: str = "-s -w"
    renames: dict[str, str] = field(default_factory=dict)  # go's binary name -> ours
    # Build inside the module's own go.mod and go.sum instead of a wrapper: for a module whose
    # dependencies include one the checksum database does not list (Kueue's scheduler-library).
    in_module: bool = False
    # Source edits (file in the module -> (exact text, replacement)) made before an in-module build.
    edits: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Repeat the module's own `replace` lines (those to a version, not a directory) in the wrapper,
    # and add these (module -> "module version").
    module_replaces: bool = False
    replaces: dict[str, str] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    # A module the checksum database does not list: fetched with GONOSUMDB for its path, and its
    # hash checked against this pinned one instead.
    pinned_sum: str | None = None
    # Dependencies built from a copy of a pinned (checksum-verified) version with files added:
    # module -> (version, {path in the module: Go source}). For a declaration the version the
    # module proxy serves lacks; each added file says where its content comes from.
    additions: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)

    @property
    def outputs(self) -> list[str]:
        names = [re.sub(r"/v\d+$", "", p).rsplit("/", 1)[-1] for p in self.packages]
        return [self.renames.get(n, n) for n in names]


def _go_env(gopath_dirs: Path, nosumdb: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Never let `go` fetch another toolchain: this machine reaches the module proxy, not go.dev.
    env["GOTOOLCHAIN"] = "local"
    env["GOFLAGS"] = "-mod=mod -buildvcs=false"
    if nosumdb:
        env["GONOSUMDB"] = nosumdb
    return env


def _one_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "go: " in ln or "error" in ln.lower() or "forbidden" in ln.lower():
            return ln
    return lines[-1] if lines else "no output"


def _run_go(args: list[str], cwd: Path, what: str, nosumdb: str | None = None) -> str:
    proc = subprocess.run(
        ["go", *args], cwd=cwd, env=_go_env(cwd, nosumdb), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RaygateError(f"{what} failed: {_one_line(proc.stderr or _json_error(proc.stdout))}")
    return proc.stdout


def _json_error(stdout: str) -> str:
    """`go mod download -json` reports a failure in the JSON on stdout and leaves stderr empty."""
    errors = re.findall(r'"Error":\s*("(?:[^"\\]|\\.)*")', stdout)
    return "\n".join(json.loads(e) for e in errors) or stdout


def check_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise RaygateError(
            "the Go toolchain is missing: install Go "
            f"{v.GO_MIN[0]}.{v.GO_MIN[1]} or newer and put `go` on PATH (needed to build kube-apiserver)"
        )
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout
    m = re.match(r"go(\d+)\.(\d+)", out.strip())
    if not m or (int(m[1]), int(m[2])) < v.GO_MIN:
        raise RaygateError(
            f"Go {out.strip() or '?'} is too old: install Go {v.GO_MIN[0]}.{v.GO_MIN[1]} or newer"
        )
    return out.strip()


def _download_info(module: str, version: str, workdir: Path, nosumdb: str | None = None) -> dict[str, str]:
    out = _run_go(["mod", "download", "-json", f"{module}@{version}"], workdir,
                  f"downloading Go module {module}@{version}", nosumdb)
    info: dict[str, str] = json.loads(out)
    if info.get("Error"):
        raise RaygateError(f"downloading Go module {module}@{version} failed: {_one_line(info['Error'])}")
    return info


def download_module(module: str, version: str, workdir: Path) -> Path:
    """`go mod download` one module and return its directory in the module cache."""
    return Path(_download_info(module, version, workdir)["Dir"])


def _pinned(w: _GoBuild, work: Path) -> str | None:
    """Download a module the checksum database does not list and check its hash; the GONOSUMDB it needs."""
    if w.pinned_sum is None:
        return None
    nosumdb = "/".join(w.module.split("/")[:2])
    info = _download_info(w.module, w.version, work, nosumdb)
    if info.get("Sum") != w.pinned_sum:
        raise RaygateError(f"{w.module}@{w.version} has hash {info.get('Sum')}, not the pinned {w.pinned_sum}: "
                           "refusing to build it")
    return nosumdb


def _module_replaces(w: _GoBuild, work: Path, nosumdb: str | None) -> dict[str, str]:
    text = Path(_download_info(w.module, w.version, work, nosumdb)["GoMod"]).read_text()
    found = re.findall(r"^\s*(?:replace\s+)?(\S+)\s+=>\s+(\S+)\s+(v\S+)\s*$", text, flags=re.M)
    return {m: f"{target} {version}" for m, target, version in found}


def _k8s_staging_replaces(workdir: Path) -> dict[str, str]:
    gomod = _run_go(
        ["mod", "download", "-json", f"{v.K8S_MODULE}@{v.K8S_VERSION}"], workdir,
        f"downloading Go module {v.K8S_MODULE}@{v.K8S_VERSION}",
    )
    text = Path(json.loads(gomod)["GoMod"]).read_text()
    staging = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", text, flags=re.M)
    if not staging:
        raise RaygateError(f"{v.K8S_MODULE}@{v.K8S_VERSION} go.mod lists no staging modules")
    return {m: f"{m} {v.K8S_STAGING_VERSION}" for m in staging}


def _k8s_ldflags() -> str:
    major, minor = v.K8S_VERSION.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={v.K8S_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return " ".join(flags)


def _build_in_module(w: _GoBuild, work: Path, out_dir: Path) -> None:
    src = work / f"{w.name}-src"
    shutil.copytree(download_module(w.module, w.version, work), src)
    for path in (src, *src.rglob("*")):  # the module cache is read-only
        path.chmod(path.stat().st_mode | 0o200)
    for rel, (old, new) in w.edits.items():
        text = (src / rel).read_text()
        if text.count(old) != 1:
            raise RaygateError(f"{w.module}@{w.version}: {rel} no longer contains {old!r}; update the edit")
        (src / rel).write_text(text.replace(old, new))
    _run_go(
        ["build", "-trimpath", f"-ldflags={w.ldflags}", "-o", str(out_dir) + "/",
         *["./" + p.removeprefix(w.module).lstrip("/") for p in w.packages]],
        src,
        f"building {', '.join(w.outputs)}",
    )
    for built, ours in w.renames.items():
        (out_dir / built).rename(out_dir / ours)


def _build(w: _GoBuild, work: Path, out_dir: Path) -> None:
    if w.in_module:
        _build_in_module(w, work, out_dir)
        return
    wdir = work / w.name
    wdir.mkdir(parents=True, exist_ok=True)
    lines = [f"module raygate.local/{w.name}", "", "go 1.26.0", ""]
    nosumdb = _pinned(w, work)
    replaces = dict(_k8s_staging_replaces(work)) if w.staging_replaces else {}
    if w.module_replaces:
        replaces.update(_module_replaces(w, work, nosumdb))
    replaces.update(w.replaces)
    for module, (version, files) in w.additions.items():
        replaces[module] = "./" + _with_additions(module, version, files, work, wdir).name
    if replaces:
        lines += ["replace ("] + [f"\t{m} => {target}" for m, target in sorted(replaces.items())] + [")"]
    (wdir / "go.mod").write_text("\n".join(lines) + "\n")
    (wdir / "go.sum").unlink(missing_ok=True)
    # Tags matter to `go get` too: they decide which imports (and which modules) the build needs.
    tags = [f"-tags={','.join(w.tags)}"] if w.tags else []
    _run_go(["get", *tags, *[f"{p}@{w.version}" for p in w.packages]], wdir,
            f"downloading Go module {w.module}@{w.version}", nosumdb)
    if w.pinned_sum is not None and f"{w.module} {w.version} {w.pinned_sum}" not in (wdir / "go.sum").read_text():
        raise RaygateError(f"{w.module}@{w.version} in the build does not have the pinned hash {w.pinned_sum}")
    _run_go(
        ["build", "-trimpath", *tags, f"-ldflags={w.ldflags}", "-o", str(out_dir) + "/", *w.packages],
        wdir,
        f"building {', '.join(p.rsplit('/', 1)[-1] for p in w.packages)}",
        nosumdb,
    )
    for built, ours in w.renames.items():
        (out_dir / built).rename(out_dir / ours)


def _with_additions(module: str, version: str, files: dict[str, str], work: Path, wdir: Path) -> Path:
    """A writable copy of `module@version` (checked against the checksum database as it downloads)
    beside the wrapper, with `files` added; an existing file is never overwritten."""
    dst = wdir / ("added-" + module.replace("/", "_"))
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(download_module(module, version, work), dst)
    for path in (dst, *dst.rglob("*")):  # the module cache is read-only
        path.chmod(path.stat().st_mode | 0o200)
    for rel, text in files.items():
        if (dst / rel).exists():
            raise RaygateError(f"{module}@{version} already has {rel}: drop that addition")
        (dst / rel).write_text(text)
    return dst


def _collect_crds(work: Path, crd_dir: Path) -> list[str]:
    sources = [
        (v.KUBERAY_MODULE, v.KUBERAY_VERSION, "config/crd/bases", "ray.io_*.yaml"),
        (v.KUEUE_MODULE, v.KUEUE_VERSION, "config/components/crd/bases", "kueue.x-k8s.io_*.yaml"),
        (v.VOLCANO_MODULE, v.VOLCANO_VERSION, "config/crd/volcano/bases", "scheduling.volcano.sh_*.yaml"),
        (v.AUTOSCALER_APIS_MODULE, v.AUTOSCALER_APIS_VERSION, "config/crd", "autoscaling.x-k8s.io_*.yaml"),
    ]
    crd_dir.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    for module, version, sub, pattern in sources:
        found = sorted((download_module(module, version, work) / sub).glob(pattern))
        if not found:
            raise RaygateError(f"no CRDs matching {sub}/{pattern} in {module}@{version}")
        for f in found:
            shutil.copyfile(f, crd_dir / f.name)
            names.append(f.name)
    return names


# The one declaration Volcano v1.15.1 uses that volcano.sh/apis v1.14.0 lacks: the scheduling gate of
# its SchedulingGatesQueueAdmission feature (off by default, and off here). Value as Volcano's design
# doc docs/design/scheduling-gates-queue-admission.md (in the v1.15.1 module) defines it.
VOLCANO_APIS_ADDITIONS = {"pkg/apis/scheduling/v1beta1/raygate_added.go": (
    "// Added by raygate's build (raygate/devenv/build.py): declared by volcano.sh/apis after v1.14.0.\n\n"
    "package v1beta1\n\n"
    "// QueueAllocationGateKey is the scheduling gate Volcano's queue admission removes.\n"
    'const QueueAllocationGateKey = GroupName + "/queue-allocation-gate"\n'
)}


def _builds() -> list[_GoBuild]:
    return [
        # go names a binary after the last path element without the major-version suffix.
        _GoBuild("etcd", v.ETCD_MODULE, v.ETCD_VERSION, [v.ETCD_MODULE], renames={"server": "etcd"}),
        _GoBuild(
            "kuberay", v.KUBERAY_MODULE, v.KUBERAY_VERSION, [v.KUBERAY_MODULE],
            renames={"ray-operator": "kuberay-operator"},
        ),
        _GoBuild(
            "kueue", v.KUEUE_MODULE, v.KUEUE_VERSION, [f"{v.KUEUE_MODULE}/cmd/kueue"], in_module=True,
            # With its own certificate management off, Kueue reads a metrics certificate from a fixed
            # path under /etc even when metrics are off; the local run points it at its work dir.
            edits={"cmd/kueue/main.go": (
                'metricsCertPath := "/etc/kueue/metrics/certs"',
                f'metricsCertPath := os.Getenv("{KUEUE_METRICS_CERT_DIR_ENV}")\n'
                '\t\tif metricsCertPath == "" {\n\t\t\tmetricsCertPath = "/etc/kueue/metrics/certs"\n\t\t}',
            )},
        ),
        _GoBuild(  # the version stamps helm's Makefile sets (Kubernetes 1.34: the client-go it builds with)
            "helm", v.HELM_MODULE, v.HELM_VERSION, [f"{v.HELM_MODULE}/cmd/helm"],
            ldflags="-s -w " + " ".join(
                [f"-X {v.HELM_MODULE}/internal/version.version={v.HELM_VERSION}"]
                + [f"-X {v.HELM_MODULE}/pkg/{p}.k8sVersion{k}={n}" for p in ("lint/rules", "chartutil")
                   for k, n in (("Major", "1"), ("Minor", "34"))]
            ),
        ),
        _GoBuild(
            "kubernetes",
            v.K8S_MODULE,
            v.K8S_VERSION,
            [f"{v.K8S_MODULE}/cmd/{c}" for c in ("kube-apiserver", "kube-controller-manager", "kubectl")],
            staging_replaces=True,
            ldflags=_k8s_ldflags(),
        ),
        # The capacity layer: pods are scheduled onto fake nodes that cluster-autoscaler creates.
        _GoBuild("kube-scheduler", v.K8S_MODULE, v.K8S_VERSION, [f"{v.K8S_MODULE}/cmd/kube-scheduler"],
                 staging_replaces=True, ldflags=_k8s_ldflags()),
        _GoBuild("kwok", v.KWOK_MODULE, v.KWOK_VERSION, [f"{v.KWOK_MODULE}/cmd/kwok"]),
        _GoBuild(
            "cluster-autoscaler", v.AUTOSCALER_MODULE, v.AUTOSCALER_VERSION, [v.AUTOSCALER_MODULE],
            module_replaces=True, tags=["kwok"], pinned_sum=v.AUTOSCALER_SUM,
            replaces={v.AUTOSCALER_APIS_MODULE: f"{v.AUTOSCALER_APIS_MODULE} {v.AUTOSCALER_BUILD_APIS_VERSION}"},
        ),
        # Volcano mode for real: the Volcano scheduler gang-binds pods; its controller-manager opens queues.
        _GoBuild(
            "volcano", v.VOLCANO_MODULE, v.VOLCANO_VERSION,
            [f"{v.VOLCANO_MODULE}/cmd/scheduler", f"{v.VOLCANO_MODULE}/cmd/controller-manager"],
            module_replaces=True, renames={"scheduler": "vc-scheduler", "controller-manager": "vc-controller-manager"},
            additions={v.VOLCANO_APIS_MODULE: (v.VOLCANO_BUILD_APIS_VERSION, VOLCANO_APIS_ADDITIONS)},
        ),
    ]


def _build_all(wrappers: list[_GoBuild], work: Path, out_dir: Path, log: bool) -> dict[str, float]:
    work.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    for w in wrappers:
        t0 = time.monotonic()
        if log:
            print(f"cluster-bins: building {w.module}@{w.version} ...", flush=True)
        _build(w, work, out_dir)
        timings[w.name] = time.monotonic() - t0
    return timings


def _log_timings(timings: dict[str, float]) -> None:
    for name, secs in timings.items():
        print(f"cluster-bins: built {name:<11} in {secs:6.1f}s")


def _add_missing(bundle: Bundle, log: bool) -> Bundle:
    """A bundle built before a binary joined BINARIES gets just that binary, not a 10-minute rebuild."""
    check_go()
    wrappers = [w for w in _builds() if set(w.outputs) & set(bundle.missing)]
    staging = bundle.root.with_name(bundle.root.name + ".adding")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "bin").mkdir(parents=True)
    timings = _build_all(wrappers, staging / "work", staging / "bin", log)
    for built in (staging / "bin").iterdir():
        built.rename(bundle.binary(built.name))
    shutil.rmtree(staging)
    manifest_file = bundle.root / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["binaries"] = sorted(p.name for p in bundle.bin_dir.iterdir())
    manifest["buildSeconds"] = {**manifest.get("buildSeconds", {}), **{k: round(t, 1) for k, t in timings.items()}}
    manifest_file.write_text(json.dumps(manifest, indent=2) + "\n")
    if log:
        _log_timings(timings)
    return bundle


def ensure_bundle(*, force: bool = False, log: bool = True) -> Bundle:
    """Build the binaries and collect the CRDs once per pinned version set; reuse them afterwards."""
    bundle = Bundle(v.bundle_dir())
    if bundle.complete and not force:
        if log:
            print(f"cluster-bins: cached in {bundle.root}")
        return bundle
    if bundle.built and not force:
        return _add_missing(bundle, log)
    go_version = check_go()
    started = time.monotonic()
    staging = bundle.root.with_name(bundle.root.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    work = staging / "work"
    work.mkdir(parents=True)
    out_dir = staging / "bin"
    timings = _build_all(_builds(), work, out_dir, log)
    crds = _collect_crds(work, staging / "crds")
    shutil.rmtree(work)
    manifest = {
        "go": go_version,
        "kubernetes": v.K8S_VERSION,
        "etcd": v.ETCD_VERSION,
        "kuberay": v.KUBERAY_VERSION,
        "kueue": v.KUEUE_VERSION,
        "volcano": v.VOLCANO_VERSION,
        "autoscalerApis": v.AUTOSCALER_APIS_VERSION,
        "binaries": sorted(p.name for p in out_dir.iterdir()),
        "crds": crds,
        "buildSeconds": {k: round(s, 1) for k, s in timings.items()},
    }
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (staging / "COMPLETE").write_text("")
    shutil.rmtree(bundle.root, ignore_errors=True)
    staging.rename(bundle.root)
    if log:
        total = time.monotonic() - started
        _log_timings(timings)
        print(f"cluster-bins: {len(manifest['binaries'])} binaries, {len(crds)} CRDs in {bundle.root} ({total:.0f}s)")
    return bundle

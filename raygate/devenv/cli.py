"""`raygate dev up | down | env | build`: the local control plane from the command line."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from raygate.errors import RaygateError


def default_dir() -> Path:
    return Path(os.environ.get("RAYGATE_DEV_DIR", ".dev"))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser(
        "dev",
        help="run a local control plane (etcd, kube-apiserver, controller-manager, KubeRay) on loopback",
        description="A real Kubernetes control plane on 127.0.0.1, built from pinned Go modules.",
    )
    dev.add_argument("--dir", type=Path, default=default_dir(), help="state directory (default: .dev)")
    dev_sub = dev.add_subparsers(dest="dev_command", metavar="ACTION", required=True)

    up = dev_sub.add_parser("up", help="start the control plane (harmless when it already runs)")
    up.add_argument("--kuberay", action="store_true", help="also run the KubeRay operator")
    up.add_argument(
        "--raygate", action="store_true", help="also run raygate (webhook and reconciler) and opt in namespace demo"
    )
    up.add_argument(
        "--port", "--apiserver-port", dest="port", type=int, default=None,
        help="kube-apiserver port (default: a free one)",
    )
    up.set_defaults(func=_up)

    down = dev_sub.add_parser("down", help="stop every process `up` started")
    down.set_defaults(func=_down)

    env = dev_sub.add_parser("env", help="print the KUBECONFIG line to export")
    env.set_defaults(func=_env)

    build = dev_sub.add_parser("build", help="build the pinned binaries and collect the CRDs (make cluster-bins)")
    build.add_argument("--force", action="store_true", help="rebuild even when the cache is complete")
    build.set_defaults(func=_build)


def _control_plane(args: argparse.Namespace, *, build: bool = False):  # type: ignore[no-untyped-def]
    from raygate.devenv.build import Bundle, ensure_bundle
    from raygate.devenv.controlplane import ControlPlane
    from raygate.devenv.versions import bundle_dir

    bundle = ensure_bundle() if build else Bundle(bundle_dir())
    return ControlPlane(args.dir, bundle)


def _up(args: argparse.Namespace) -> int:
    cp = _control_plane(args, build=True)
    cp.up(kuberay=args.kuberay or args.raygate, apiserver_port=args.port)
    if args.raygate:
        from raygate.devenv.raygate_local import start_raygate

        start_raygate(cp)
    print(f"export KUBECONFIG={cp.kubeconfig}")
    return 0


def _down(args: argparse.Namespace) -> int:
    _control_plane(args).down()
    return 0


def _env(args: argparse.Namespace) -> int:
    cp = _control_plane(args)
    if cp.load_state() is None:
        raise RaygateError(f"no control plane in {cp.workdir}: run `raygate dev up` first")
    print(f"export KUBECONFIG={cp.kubeconfig}")
    return 0


def _build(args: argparse.Namespace) -> int:
    from raygate.devenv.build import ensure_bundle

    ensure_bundle(force=args.force)
    return 0

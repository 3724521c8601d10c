# syntax=docker/dockerfile:1
# raygate: one image for the webhook (`raygate webhook`) and the reconciler (`raygate reconciler`).
#   docker build -t ghcr.io/raygate/raygate:0.1.0 .
# Needs BuildKit (the default builder since Docker 23) or buildah for the bind mount in the final stage.
# BASE_IMAGE: any Debian-like image with python3.11 and pip on PATH. `make image` builds with buildah
# from a base bootstrapped from Debian packages (image/build.sh), so it needs no registry.

ARG BASE_IMAGE=python:3.11.13-slim-bookworm

# --- builder: raygate's wheel plus a wheel for every dependency -------------------------------
FROM ${BASE_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src

# Exactly the files the wheel is built from (tests/integration/test_packaging.py builds the
# wheel from this same list, so a package missing here fails a test, not a release).
# webhook/, reconciler/ and certs/ are installed as raygate.webhook, raygate.reconciler and
# raygate.certs (package-dir in pyproject.toml): the wheel holds the one top-level name raygate.
COPY pyproject.toml README.md ./
COPY raygate/ raygate/
COPY webhook/ webhook/
COPY reconciler/ reconciler/
COPY certs/ certs/

# All dependencies ship manylinux wheels, so no compiler is needed here either; if one ever
# needs building, it fails here rather than pulling a toolchain into the final image.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# --- final: the interpreter, the wheels, nothing else -----------------------------------------
FROM ${BASE_IMAGE}

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="raygate" \
      org.opencontainers.image.description="Gang admission for Ray on Kubernetes: a mutating admission webhook and a reconciler" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# No .pyc writes at run time (the root filesystem is read-only in the Deployments; pip compiled
# the bytecode at install time) and unbuffered logs, so a crash never loses its last lines.
# MALLOC_ARENA_MAX: glibc gives each thread that allocates an arena of its own (up to 8 per core); two
# are plenty for processes whose threads mostly wait (the GIL runs one at a time), and the reconciler
# with its 64 workers held about 4 MB less (docs/benchmarks.md, "The whole footprint").
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MALLOC_ARENA_MAX=2

# Install from the builder's wheels only (--no-index: no second resolution against the
# network). The wheels are bind-mounted, not copied, so they never become an image layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/raygate-*.whl

# Numeric, so the kubelet can verify runAsNonRoot without looking the name up; 65532 matches
# runAsUser in config/base. No home directory or shell setup is needed.
USER 65532:65532

ENTRYPOINT ["raygate"]
CMD ["--help"]

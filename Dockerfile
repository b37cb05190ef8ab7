# kproxy container image.
#
#   docker build -t kproxy:0.1.0 .
#   docker run --rm -v "$PWD/kproxy.yaml:/etc/kproxy/kproxy.yaml:ro" -p 19092-19095:19092-19095 -p 9308:9308 kproxy:0.1.0
#   docker run --rm --health-cmd "kproxy health" kproxy:0.1.0 run --upstream kafka:9092 --listen 0.0.0.0:19092 --metrics-listen 0.0.0.0:9308
#
#   docker build --build-arg VCS_REF="$(git rev-parse HEAD)" --build-arg SOURCE_URL="$(git remote get-url origin)" -t kproxy:0.1.0 .
#   buildah bud --format docker -t kproxy:0.1.0 .     # without Docker (deploy/kubernetes/README.md)
#
# Build arguments: BASE, the image both stages start from: any Debian-based image whose `python3` is
# CPython 3.11+ with its venv module (the default, or e.g. a Debian bookworm or trixie with python3,
# python3-venv and ca-certificates); KPROXY_PURE=1 builds the image without the compiled hot path.
#
# Stage 1 builds wheels: every dependency's first, and what building kproxy's needs, from
# pyproject.toml alone, so a change to kproxy's source reuses that layer; then kproxy's own, its hot
# path compiled by mypyc (setup.py: a C compiler is installed in this stage only), offline, and installs
# it into the venv /opt/kproxy. Stage 2 copies that venv in (the same base, so the same interpreter at
# the same path) and runs as an unprivileged user: no compiler, no pip, no wheels in it. The default
# base is pinned by digest (the tag names it for people); to move to a newer base, replace the digest
# with the one `docker buildx imagetools inspect python:3.11-slim-trixie` prints.
ARG BASE=python:3.11-slim-trixie@sha256:9534e5a8e315485d4061ed659af0fd78a284c015f9b73661b41d6bab25604534

FROM ${BASE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# gcc and the C library's headers for mypyc, and the Python headers when the base's python3 is
# Debian's (the python images carry their own). Held to Debian's packaging of them (gcc's epoch 4,
# glibc 2, Python 3), not to one release's versions: the base is an argument, and its digest is what
# makes a build repeatable.
RUN apt-get update \
    && apt-get install -y --no-install-recommends "gcc=4:*" "libc6-dev=2.*" "ccache=4.*" \
    && if ! python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then \
           apt-get install -y --no-install-recommends "python3-dev=3.*"; \
       fi \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# pip, in a venv of the build stage's own (a Debian python3 refuses to install into itself: PEP 668).
# Only what the wheels are built from (.dockerignore keeps the rest of the context out).
COPY pyproject.toml ./
RUN python3 -m venv /opt/build \
    && /opt/build/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); print("\n".join(p["project"]["dependencies"] + p["build-system"]["requires"]))' \
        > /tmp/requirements.txt \
    && /opt/build/bin/python -m pip wheel --no-cache-dir --wheel-dir /wheels -r /tmp/requirements.txt \
    && /opt/build/bin/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' \
        > /tmp/build-requirements.txt \
    && /opt/build/bin/python -m pip install --no-cache-dir --no-index --find-links /wheels -r /tmp/build-requirements.txt
COPY README.md setup.py ./
COPY scripts/native_build.py ./scripts/
COPY kproxy ./kproxy
# The venv gets no pip of its own: the build stage's pip installs into it (--python). pip
# byte-compiles on install, so a read-only root filesystem costs nothing at start-up. The last line
# prints which build the image carries, and refuses a pure one unless KPROXY_PURE asked for it.
# The wheel is built in the build venv, which holds what [build-system] requires (installed above),
# rather than in an isolated environment under a new temporary path each time: with the paths the
# same from build to build, ccache (its cache kept between builds by the cache mount) hands back
# the object of a C file it compiled before, byte for byte the same input, and compiles any other.
# A change to a module that is not compiled rebuilds this layer without compiling the C again.
# (RUN --mount needs BuildKit, Docker's default builder since 23.0, or buildah.)
ARG KPROXY_PURE=
RUN --mount=type=cache,target=/root/.cache/ccache \
    PATH="/usr/lib/ccache:$PATH" /opt/build/bin/python -m pip wheel --no-cache-dir --no-build-isolation --no-index \
        --find-links /wheels --no-deps --wheel-dir /wheels . \
    && python3 -m venv --without-pip /opt/kproxy \
    && /opt/build/bin/python -m pip --python /opt/kproxy/bin/python install --no-cache-dir --no-index \
        --find-links /wheels /wheels/kproxy_kafka-*.whl \
    && /opt/kproxy/bin/kproxy --version > /tmp/version \
    && cat /tmp/version \
    && { [ -n "$KPROXY_PURE" ] || grep -q '^build: compiled' /tmp/version; }


FROM ${BASE}

# Where the image came from: the repository and, when the build passes it, the commit.
ARG BASE
ARG VCS_REF=unknown
ARG SOURCE_URL=unknown
LABEL org.opencontainers.image.title="kproxy" \
      org.opencontainers.image.description="Kafka-protocol-aware transparent TCP proxy: broker address rewriting, YAML fault injection, per-API latency and error metrics" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.base.name="${BASE}"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH="/opt/kproxy/bin:${PATH}"

COPY --from=build /opt/kproxy /opt/kproxy
RUN groupadd --system --gid 10001 kproxy \
    && useradd --system --no-log-init --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin kproxy \
    && mkdir -p /etc/kproxy

# Numeric, so Kubernetes can check runAsNonRoot against the image.
USER 10001:10001
WORKDIR /

# Bootstrap listener and /metrics, /healthz, /readyz (as in deploy/kproxy.example.yaml).
# Broker N listens on broker_port_base + N (default 19093 + N): publish those too.
EXPOSE 19092 9308

# kproxy handles SIGTERM itself: stop accepting, drain in-flight requests
# (limits.shutdown_grace), exit.
STOPSIGNAL SIGTERM
# The kproxy command probes its own /healthz (the metrics_listen of the config file the
# default CMD reads), so the image needs no curl. Override it with the CMD when running
# without that file. Kubernetes ignores HEALTHCHECK and uses the chart's probes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["kproxy", "health", "--config", "/etc/kproxy/kproxy.yaml"]
ENTRYPOINT ["kproxy"]
CMD ["run", "--config", "/etc/kproxy/kproxy.yaml"]

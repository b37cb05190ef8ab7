# syntax=docker/dockerfile:1
#
# kproxy container image.
#
#   docker build -t kproxy:0.1.0 .
#   docker run --rm -v "$PWD/kproxy.yaml:/etc/kproxy/kproxy.yaml:ro" -p 19092-19095:19092-19095 -p 9308:9308 kproxy:0.1.0
#   docker run --rm --health-cmd "kproxy health" kproxy:0.1.0 run --upstream kafka:9092 --listen 0.0.0.0:19092 --metrics-listen 0.0.0.0:9308
#
#   docker build --build-arg VCS_REF="$(git rev-parse HEAD)" --build-arg SOURCE_URL="$(git remote get-url origin)" -t kproxy:0.1.0 .
#
# Stage 1 builds wheels: every dependency's first, from pyproject.toml alone, so a
# change to kproxy's source reuses that layer; then kproxy's own, its hot path
# compiled by mypyc (setup.py: a C compiler is installed in this stage only, and
# `kproxy --version` in the image says "compiled"). Stage 2 installs them from that
# local wheel directory into a venv, without network access and without compilers,
# then runs as an unprivileged user. The base image is pinned by
# digest (the tag names it for people); to move to a newer base, replace both
# digests with the one `docker buildx imagetools inspect python:3.11-slim-trixie` prints.

FROM python:3.11-slim-trixie@sha256:9534e5a8e315485d4061ed659af0fd78a284c015f9b73661b41d6bab25604534 AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# gcc and the C library's headers for mypyc (the Python headers come with the image); versions held to
# trixie's compiler and C library, point releases allowed.
RUN apt-get update \
    && apt-get install -y --no-install-recommends "gcc=4:14.*" "libc6-dev=2.41-*" \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# Only what the wheels are built from (.dockerignore keeps the rest of the context out).
COPY pyproject.toml ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt \
    && python -m pip wheel --no-cache-dir --wheel-dir /wheels -r /tmp/requirements.txt
COPY README.md setup.py ./
COPY scripts/native_build.py ./scripts/
COPY kproxy ./kproxy
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .


FROM python:3.11-slim-trixie@sha256:9534e5a8e315485d4061ed659af0fd78a284c015f9b73661b41d6bab25604534

# Where the image came from: the repository and, when the build passes it, the commit.
ARG VCS_REF=unknown
ARG SOURCE_URL=unknown
LABEL org.opencontainers.image.title="kproxy" \
      org.opencontainers.image.description="Kafka-protocol-aware transparent TCP proxy: broker address rewriting, YAML fault injection, per-API latency and error metrics" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim-trixie"

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH="/opt/kproxy/bin:${PATH}"

# The venv gets no pip of its own: the base image's pip installs into it
# (--python), from the wheels of stage 1 only (--no-index), mounted for this
# step rather than copied, so they are not left in a layer. pip byte-compiles
# on install, so a read-only root filesystem costs nothing at start-up.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv --without-pip /opt/kproxy \
    && python -m pip --python /opt/kproxy/bin/python install --no-cache-dir --no-index \
        --find-links /wheels /wheels/kproxy_kafka-*.whl \
    && groupadd --system --gid 10001 kproxy \
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

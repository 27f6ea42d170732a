# pg-advisory-exporter as a container image. Build it where images are built:
#   docker build -t pg-advisory-exporter .     (BuildKit, Docker's default builder since 23.0)
#   podman build -t pg-advisory-exporter .
# and run it as the command: docker run -p 9846:9846 pg-advisory-exporter --dsn '...'
# VCS_REF: the commit built (`--build-arg VCS_REF=$(git rev-parse HEAD)`, as `make dist`
# passes it): `--version` names it, and so does the revision label. The build context has
# no .git to read it from.
#
# BASE_IMAGE: a Debian-based image whose python3 (3.11 or newer) can make a venv. The
# official slim image is the default; the tests build on a local Debian root instead.
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
# The build's pip lives in a venv of its own: Debian's python3 refuses system-wide installs
# (PEP 668), and the official image's pip should not be what the final venv depends on.
RUN python3 -m venv /opt/build
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY exporter/ exporter/
# The project's wheel and the wheel of every dependency: all are on PyPI for manylinux, so
# no compiler is needed. tzdata as a wheel: psycopg maps the server's TimeZone with
# zoneinfo when it reads a timestamptz, and zoneinfo finds the wheel whether or not the base
# has Debian's tzdata (with neither, psycopg logs "unknown PostgreSQL timezone" and uses UTC).
# pip's cache is a cache mount: never in a layer, and where the builder keeps such mounts
# (BuildKit does), a rebuild after a source change downloads nothing again. setup.py's hook
# bakes VCS_REF into the package (an ARG is in the environment of the RUN steps after it).
ARG VCS_REF=
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/build/bin/pip wheel --wheel-dir /wheels . 'tzdata>=2024.1'
# The venv the image runs, installed from those wheels alone (without --no-deps, a missing
# one fails the build) at its final path, since a venv cannot move, and on the final
# stage's base, since it links to that python3. Byte-compiled here: a read-only root takes
# no .pyc files later. No pip inside: the build's pip installs into it.
RUN python3 -m venv --without-pip /opt/pg-advisory-exporter \
    && /opt/build/bin/pip --python /opt/pg-advisory-exporter/bin/python install \
       --no-cache-dir --no-index /wheels/*.whl

FROM ${BASE_IMAGE}
# A fixed numeric UID, so that Kubernetes can check runAsNonRoot from the image alone. 65532
# (distroless's "nonroot") rather than nobody (65534): nobody is the ID that user namespaces
# and NFS give to unmapped owners, and the exporter's files and processes should not be
# mistaken for those. The home directory does not exist: the exporter writes nothing.
RUN groupadd --system -K SYS_GID_MAX=65532 --gid 65532 exporter \
    && useradd --system -K SYS_UID_MAX=65532 --uid 65532 --gid 65532 \
       --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin exporter
# Only the venv leaves the build stage: no wheels, source tree, build tools or pip cache.
# (Not a RUN --mount of the build stage: podman 4.3 mounts a cached stage empty.)
COPY --from=build /opt/pg-advisory-exporter /opt/pg-advisory-exporter
ENV PATH=/opt/pg-advisory-exporter/bin:$PATH

# The version is pg_advisory_exporter.__version__, which `make generate` writes here (a test
# fails when they differ), rather than an ARG default: podman's layer cache does not see a
# changed ARG default and would keep the old label. A build argument's value it does see:
# the revision is VCS_REF's, empty where the build was not told.
ARG VCS_REF=
LABEL org.opencontainers.image.title="pg-advisory-exporter" \
      org.opencontainers.image.description="Prometheus exporter for PostgreSQL advisory locks: who holds them, for how long, who waits, and how full the lock table is" \
      org.opencontainers.image.version="0.4.0" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.source="https://github.com/pg-advisory-exporter/pg-advisory-exporter" \
      org.opencontainers.image.licenses="Apache-2.0"

USER 65532:65532
EXPOSE 9846
ENTRYPOINT ["pg-advisory-exporter"]

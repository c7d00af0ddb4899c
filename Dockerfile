# syntax=docker/dockerfile:1
# The slotsched image: `slotsched serve` (the scheduler) and `slotsched worker` (the reference
# worker) from one image; the manifests in deploy/ pass the subcommand as args.
#
#   docker build -t ghcr.io/slotsched/slotsched:0.1.0 .
#
# PYTHON_VERSION must satisfy pyproject's requires-python (a test checks it).
ARG PYTHON_VERSION=3.11

# --- build: generate the proto stubs from proto/ and install the package into a venv ---------
# With every extra (`all`): the overlays use Redis state, S3 snapshots and the Kubernetes API.
FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The protoc of grpcio-tools, the version pyproject's test extra pins: the stubs built here are
# byte-for-byte the committed scheduler/api/gen (tests/test_proto_generated.py), but made from
# proto/ so the image never ships stale ones. Installed outside the venv: not in the image.
RUN pip install grpcio-tools==1.85.1
COPY pyproject.toml README.md ./
COPY proto/ proto/
COPY scripts/gen_proto.py scripts/gen_proto.py
COPY scheduler/ scheduler/
COPY slots/ slots/
COPY snapshots/ snapshots/
RUN python scripts/gen_proto.py \
 && python -m venv /opt/slotsched \
 && /opt/slotsched/bin/pip install '.[all]' \
 && /opt/slotsched/bin/slotsched --help >/dev/null

# --- runtime: the venv only, as a non-root user ------------------------------------------------
FROM python:${PYTHON_VERSION}-slim
# uid/gid 10001: the manifests' securityContext (runAsUser/runAsGroup/fsGroup) names the same.
RUN groupadd --system --gid 10001 slotsched \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin slotsched
COPY --from=build /opt/slotsched /opt/slotsched
ENV PATH=/opt/slotsched/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib
USER 10001:10001
# scheduler gRPC, scheduler metrics, worker gRPC, worker metrics (deploy/base)
EXPOSE 50051 9464 50052 9465
ENTRYPOINT ["slotsched"]
CMD ["serve", "--listen=0.0.0.0:50051", "--metrics-listen=0.0.0.0:9464"]

# syntax=docker/dockerfile:1
#
# agent-rewind: the gRPC service and the Claude Code CLI it drives, in one image.
#
#   podman build -t agent-rewind .        (or docker build)
#   podman run -p 50051:50051 -v agent-rewind:/var/lib/agent-rewind \
#     -v "$PWD/access:/etc/agent-rewind/access:ro" -v "$PWD/tls:/etc/agent-rewind/tls:ro" \
#     -e ANTHROPIC_API_KEY=... \
#     --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
#     --security-opt seccomp=deploy/seccomp/agent-rewind.json \
#     --uidmap 0:100000:65536 --gidmap 0:100000:65536 --security-opt unmask=ALL agent-rewind
#
# The last line is the pod's hostUsers: false and procMount: Unmasked: the command sandbox mounts a
# /proc of its own, which the kernel refuses under a runtime's default /proc masks (Docker: a
# userns-remap daemon and --security-opt systempaths=unconfined).
#
# The server needs, at the paths below: an access file (access/access.json: the principals and
# their token hashes; `agent-rewind token create` makes an entry) and a TLS certificate and key
# (tls/tls.crt, tls/tls.key); and a model credential (ANTHROPIC_API_KEY, or another the CLI
# accepts), since the entrypoint asks for the real model. Arguments after the image name are
# appended to `agent-rewind serve`: `--model offline` runs the built-in scripted model instead
# (no credential; for trying it out), `--log-level debug`. `make image-test` builds this image and
# runs it so (deploy/README.md, "The image test"); deploy/ runs it in Kubernetes.
#
# No HEALTHCHECK: the service answers the standard gRPC health protocol (grpc.health.v1), and the
# image carries no probe binary. Kubernetes probes it natively, on the plaintext health-only port
# of --health-listen since the main port is TLS (deploy/base); elsewhere, probe it with
# grpc_health_probe or grpcurl from outside the container.

ARG PYTHON_IMAGE=python:3.11-slim

# --- builder: the package and its dependencies in a venv --------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /build
# Dependencies first, from the locked set (requirements/runtime.txt: every version pinned, every
# file's hash checked; `make lock` moves it forward), so a source change does not re-download them
# (the claude-agent-sdk wheel bundles the Claude Code CLI binary, about 370 MB).
COPY requirements/runtime.txt ./requirements.txt
RUN pip install --require-hashes -r requirements.txt

COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-deps . \
    && agent-rewind --help > /dev/null

# --- runtime ------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

# tini as PID 1: it forwards SIGTERM to the service (which shuts down gracefully) and reaps the
# orphans the CLI's tool processes can leave behind. git: workspace snapshots. bubblewrap and
# socat: the command sandbox every command of an agent runs in, and its bridge to the egress
# proxy (docs/security.md); the pod needs the seccomp profile of deploy/seccomp/ for it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini git bubblewrap socat \
    && rm -rf /var/lib/apt/lists/*

ARG UID=10001
RUN groupadd --system --gid ${UID} agent-rewind \
    && useradd --system --uid ${UID} --gid agent-rewind --no-create-home \
        --home-dir /var/lib/agent-rewind --shell /usr/sbin/nologin agent-rewind \
    && mkdir -p /var/lib/agent-rewind \
    && chown agent-rewind:agent-rewind /var/lib/agent-rewind

# Same base image and same path as in the builder, so the venv's interpreter links still resolve.
COPY --from=builder /opt/venv /opt/venv

# Authentication and TLS are on: the access file (principals, token hashes) and the server's
# certificate are mounted from Secrets at these paths (deploy/ does), or set these to others.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/agent-rewind \
    AGENT_REWIND_LOG_FORMAT=json \
    AGENT_REWIND_ACCESS_FILE=/etc/agent-rewind/access/access.json \
    AGENT_REWIND_TLS_CERT=/etc/agent-rewind/tls/tls.crt \
    AGENT_REWIND_TLS_KEY=/etc/agent-rewind/tls/tls.key

# Numeric, so Kubernetes can check runAsNonRoot against the image.
USER ${UID}:${UID}
WORKDIR /var/lib/agent-rewind

# Everything durable: the ledger (sessions, rewinds), the CLI's transcripts and file checkpoints, and
# (by default) the session workspaces. Losing it loses every session.
VOLUME ["/var/lib/agent-rewind"]
EXPOSE 50051

# The real model, explicitly: a missing credential stops the server at start instead of serving
# the scripted test model (pass --model offline to run the scripted model on purpose).
ENTRYPOINT ["/usr/bin/tini", "--", "agent-rewind", "serve", "--listen", "0.0.0.0:50051", "--state-dir", "/var/lib/agent-rewind", "--model", "anthropic"]
CMD []

# syntax=docker/dockerfile:1
#
# agent-rewind: the gRPC service and the Claude Code CLI it drives, in one image.
#
#   podman build -t agent-rewind .        (or docker build)
#   podman run -d --name agent-rewind \
#     --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
#     --security-opt seccomp=deploy/seccomp/agent-rewind.json \
#     --uidmap 0:100000:65536 --gidmap 0:100000:65536 --security-opt unmask=ALL \
#     -v agent-rewind-state:/var/lib/agent-rewind \
#     -v "$PWD/secrets/access:/etc/agent-rewind/access:ro" \
#     -v "$PWD/secrets/tls:/etc/agent-rewind/tls:ro" \
#     -p 50051:50051 -e ANTHROPIC_API_KEY agent-rewind
#
# deploy/README.md, "Run the image by hand", explains each flag and the Docker equivalent. The
# --uidmap/--gidmap and unmask=ALL are the pod's hostUsers: false and procMount: Unmasked: the
# command sandbox mounts a /proc of its own, which the kernel refuses under a runtime's default
# /proc masks (Docker: a userns-remap daemon and --security-opt systempaths=unconfined).
#
# The server needs, at the paths below: an access file (access/access.json: the principals and
# their token hashes; `agent-rewind token create` makes an entry) and a TLS certificate and key
# (tls/tls.crt, tls/tls.key), readable by the image's user, uid 10001 (with the --uidmap above,
# the host's uid 110001); and a model credential (ANTHROPIC_API_KEY, or another the CLI accepts),
# since the entrypoint asks for the real model. Arguments after the image name are appended to
# `agent-rewind serve`: `--model offline` runs the built-in scripted model instead (no
# credential; for trying it out), `--log-level debug`. `make image-test` builds this image,
# measures it and runs it so (deploy/README.md, "The image test"); deploy/ runs it in Kubernetes.
#
# No HEALTHCHECK: the service answers the standard gRPC health protocol (grpc.health.v1), and the
# image carries no probe binary. Kubernetes probes it natively, on the plaintext health-only port
# of --health-listen since the main port is TLS (deploy/base); elsewhere, probe it with
# grpc_health_probe or grpcurl from outside the container.

# Slim Debian for both stages, Python from Debian's packages: the venv made in the builder runs
# unchanged in the runtime, whose interpreter sits at the same path. The runtime stage gets only
# what the service runs: no compiler, no pip, no apt lists or caches (deploy/README.md, "The size").
ARG DEBIAN_IMAGE=debian:bookworm-slim

# --- builder: the package and its dependencies in a venv --------------------------------------
FROM ${DEBIAN_IMAGE} AS builder

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
# Every dependency ships a wheel for CPython 3.11 on x86_64 and arm64 (manylinux): nothing is
# compiled, so no compiler. ca-certificates: pip's HTTPS (Debian's pip trusts the system store).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3.11 python3.11-venv \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /build
# Dependencies first, from the locked set (requirements/runtime.txt: every version pinned, every
# file's hash checked; `make lock` moves it forward), so a source change does not re-download them
# (the claude-agent-sdk wheel bundles the Claude Code CLI binary, about 400 MB). The test suites
# some packages ship go: nothing imports them.
COPY requirements/runtime.txt ./requirements.txt
RUN pip install --require-hashes -r requirements.txt \
    && rm -rf /opt/venv/lib/python3.11/site-packages/*/tests

# The package, byte-compiled (the root file system is read-only: nothing is compiled at start),
# then pip and setuptools leave the venv: nothing at run time installs anything.
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-deps . \
    && agent-rewind --help > /dev/null \
    && python -m pip uninstall --yes --quiet pip setuptools

# --- runtime ------------------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS runtime

# Python 3.11 (python3 and python name it too, as in the official Python images, for the agents'
# commands). tini as PID 1: it forwards SIGTERM to the service (which shuts down gracefully) and
# reaps the orphans the CLI's tool processes can leave behind. git: workspace snapshots.
# bubblewrap and socat: the command sandbox every command of an agent runs in, and its bridge to
# the egress proxy (docs/security.md); the pod needs the seccomp profile of deploy/seccomp/ for it.
# No Node.js: the Claude Code CLI is the native binary bundled in the claude-agent-sdk wheel.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3.11 python3 python-is-python3 ca-certificates netbase tzdata \
        tini git bubblewrap socat \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log /var/cache/debconf/*-old

ARG UID=10001
RUN groupadd --system --gid ${UID} agent-rewind \
    && useradd --system --uid ${UID} --gid agent-rewind --no-create-home \
        --home-dir /var/lib/agent-rewind --shell /usr/sbin/nologin agent-rewind \
    && mkdir -p /var/lib/agent-rewind \
    && chown agent-rewind:agent-rewind /var/lib/agent-rewind

# Same base image and same interpreter path as in the builder, so the venv's links still resolve.
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

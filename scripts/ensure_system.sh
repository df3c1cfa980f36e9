#!/bin/sh
# The programs agent-rewind needs from the host, beside Python (README.md, docs/security.md):
#   bwrap, socat  the command sandbox (serve --sandbox on, the default) and its egress proxy
#   git           workspace snapshots
# Installed with apt-get when missing and this runs as root on Debian or Ubuntu; otherwise it
# says what to install and fails. Run by `make run` and `make test`.
set -eu
missing=""
command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"
command -v socat >/dev/null 2>&1 || missing="$missing socat"
command -v git >/dev/null 2>&1 || missing="$missing git"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing from Debian packages:$missing" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    exit 0
fi
echo "agent-rewind needs these packages:$missing" >&2
echo "  Debian/Ubuntu: sudo apt-get install$missing" >&2
echo "  (bubblewrap and socat confine the agent's commands; without them, serve with --sandbox off)" >&2
exit 1

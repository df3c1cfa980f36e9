"""The Claude Code CLI, confined by the kernel (Landlock), and its commands' door out of that.

Run as a session's CLI path (sandbox/cli.py writes the program that runs it), by the Python the
service runs on, with `-I -S`: it imports nothing but the standard library.

    python -I -S launcher.py cli RULES -- CLI [ARG...]
    python -I -S launcher.py run SOCKET COMMAND
    python -I -S launcher.py nice N -- CLI [ARG...]
    python -I -S launcher.py abi

`cli` forks. The child makes itself a Landlock domain from RULES (a JSON file: the paths it may
read and run, those it may also write, the devices it may use) and executes the CLI: from then on
the kernel refuses the CLI, and everything it starts, any other file, whatever a check in user
space allowed (a path swapped for a link between the check and the open reaches nothing). It may
not signal, ptrace or read `/proc` of a process outside its domain either (when the service is
not root: root keeps CAP_SYS_PTRACE). The parent stays outside the domain as the CLI's door for
commands: the command sandbox is bubblewrap, which mounts, and no process in a Landlock domain may
mount. It listens on SOCKET (in the session's runtime directory); `run`, which the CLI runs for
each command (CLAUDE_CODE_SHELL_PREFIX), passes it the command's text and its standard streams,
and the parent runs the session's sandbox program with them, returns the exit status, and kills
the sandbox when `run` goes away (the CLI stopped or killed the command). When the CLI exits, the
parent exits with its status; a SIGTERM or SIGINT it gets is passed on to the CLI, and the CLI
gets SIGKILL if the parent dies.

Both `cli` and `nice` first lower the CLI's priority (RULES' `nice`, or N: added to the
niceness, as nice(1) does), and with it that of every command it runs: on a busy node the agents'
work waits before the service's own answers do (`--cli-nice`). `nice` is the unconfined CLI's
program (`--cli-confinement off`): that alone, then the CLI.

`abi` prints the kernel's Landlock ABI version (0: none).
"""

from __future__ import annotations

# Only what both sides need is imported here: `run` starts for every command the agent runs, so
# the rest is imported where it is used.
import _socket  # the socket module's C core: `socket` imports far more
import os
import struct
import sys

TYPE_CHECKING = False  # typing itself is not imported at run time
if TYPE_CHECKING:
    from typing import Any

_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1

# Filesystem access rights, by the ABI that introduced them.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_FS_LATEST = (1 << 16) - 1  # ABI 5 and later
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
# Scopes (ABI 6): no abstract unix socket or signal reaches a process outside the domain.
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
# The least ABI the service confines with: 3 handles truncate(2), which 1 and 2 let through.
MIN_ABI = 3

ACCESS = {
    "read": EXECUTE | READ_FILE | READ_DIR,
    "write": _FS_LATEST,
    "device": READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV,
}

_STATUS = struct.Struct("!i")
_HEADER = struct.Struct("!I")
_MAX_REQUEST = 8 << 20
# The CLI's variables a command gets (sandbox/commands.py passes them on inside).
_PASSED = ("GIT_EDITOR", "CLAUDECODE", "COREPACK_ENABLE_AUTO_PIN", "LANG", "TERM")


def _libc() -> object:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is not there (or not enabled)."""
    if sys.platform != "linux":
        return 0
    libc: Any = _libc()
    version = libc.syscall(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    return int(version) if version > 0 else 0


def _error(what: str) -> OSError:
    import ctypes

    errno = ctypes.get_errno()
    return OSError(errno, f"landlock {what}: {os.strerror(errno)}")


def restrict(rules: list[tuple[str, str]]) -> int:
    """Makes the calling thread a Landlock domain where only `rules` ((access, path), access one
    of read, write or device) are allowed of the filesystem; every right this kernel's ABI knows
    is handled, so whatever the rules do not grant is refused. A path that does not exist is
    skipped. Returns the ABI used."""
    version = abi()
    if version < MIN_ABI:
        raise OSError(f"Landlock ABI {version} is below {MIN_ABI}")
    import ctypes

    class Attr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    handled = _FS_BY_ABI.get(version, _FS_LATEST)
    libc: Any = _libc()
    attr = Attr(handled, 0, _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if version >= 6 else 0)
    size = 24 if version >= 6 else 16 if version >= 4 else 8
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise _error("create_ruleset")
    try:
        for access, path in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                allowed = ACCESS[access] & handled
                if os.fstat(fd).st_mode & 0o170000 != 0o040000:  # not a directory: a file's rights
                    allowed &= _FILE_RIGHTS
                beneath = PathBeneath(allowed, fd)
                if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(beneath), 0):
                    raise _error(f"add_rule {path}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            raise _error("no_new_privs")
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0):
            raise _error("restrict_self")
    finally:
        os.close(ruleset)
    return version


# The door for commands (the parent's side).

# The sandboxes running, each a process group: ended when the CLI exits.
_RUNNING: set[int] = set()


def _addressable(path: str) -> str:
    """A name for the socket at `path` within AF_UNIX's 108 bytes: through its directory's
    descriptor (`/proc/self/fd/N/NAME`) when the path itself is longer."""
    if len(os.fsencode(path)) < 100:
        return path
    directory = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{directory}/{os.path.basename(path)}"


def _recv_exact(conn: _socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _descends(pid: int, ancestor: int) -> bool:
    """Whether process `pid` is `ancestor` or one of its descendants."""
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(data) // 4}i", data[: len(data) // 4 * 4]))
    return fds


def _serve_one(conn: _socket.socket, program: str, cli: int) -> None:
    """Runs one command: its request, its streams, its exit status back; killed when `run` goes.
    Only a process of the CLI's (`cli` or below) is served: the door's socket is a path, which
    Landlock does not keep another session's process from connecting to."""
    import select

    fds: list[int] = []
    pid = 0
    try:
        peer = struct.unpack("3i", conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12))[0]
        if not _descends(peer, cli):
            return
        head, ancillary, _, _ = conn.recvmsg(_HEADER.size, _socket.CMSG_SPACE(3 * 4))
        fds = _received_fds(ancillary)
        if len(head) < _HEADER.size:
            head += _recv_exact(conn, _HEADER.size - len(head))
        (size,) = _HEADER.unpack(head)
        if size > _MAX_REQUEST or len(fds) != 3:
            return
        command, *variables = _recv_exact(conn, size).split(b"\0")
        pairs = (v.split(b"=", 1) for v in variables if b"=" in v)
        env = {name.decode(): os.fsdecode(value) for name, value in pairs if name.decode() in _PASSED}
        actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)]
        pid = os.posix_spawn(
            program,
            [program, os.fsdecode(command)],
            {"PATH": "/usr/bin:/bin", **env},
            file_actions=actions,
            setsid=True,
        )
        _RUNNING.add(pid)
        for fd in fds:
            os.close(fd)
        fds = []
        pidfd = os.pidfd_open(pid)
        try:
            ready, _, _ = select.select([conn.fileno(), pidfd], [], [])
        finally:
            os.close(pidfd)
        if pidfd in ready:
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            pid = 0
            conn.sendall(_STATUS.pack(code if code >= 0 else 128 - code))
        # Else `run` went away (its command was stopped): the finally below ends the sandbox.
    except (OSError, ValueError, UnicodeDecodeError, ConnectionError):
        pass
    finally:
        for fd in fds:
            os.close(fd)
        if pid:
            _end(pid)
            os.waitpid(pid, 0)
        conn.close()


def _end(group: int) -> None:
    import signal

    _RUNNING.discard(group)
    try:  # noqa: SIM105 - contextlib is one import more on the way of every CLI start
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _door(listener: _socket.socket, program: str, cli: int) -> None:
    import _thread

    while True:
        try:
            fd, _ = listener._accept()  # type: ignore[attr-defined]  # the C core's accept: a descriptor
        except OSError:
            return
        _thread.start_new_thread(_serve_one, (_socket.socket(fileno=fd), program, cli))


def read_rules(path: str) -> tuple[list[tuple[str, str]], dict[str, str], int]:
    """The rules file sandbox/cli.py writes: NUL-separated pairs, `ACCESS PATH` (read, write,
    device), `door-socket PATH`, `door-program PATH` and `nice N`. (Not JSON: json costs an import
    more on the way of every CLI start, and a path may hold any character but NUL.)"""
    with open(path, "rb") as f:
        fields = [os.fsdecode(field) for field in f.read().split(b"\0")]
    pairs = list(zip(fields[0::2], fields[1::2], strict=False))
    door = {kind.removeprefix("door-"): value for kind, value in pairs if kind.startswith("door-")}
    nice = sum(int(value) for kind, value in pairs if kind == "nice")
    return [(kind, value) for kind, value in pairs if kind in ACCESS], door, nice


def write_rules(path: str, paths: list[tuple[str, str]], door: dict[str, str], nice: int = 0) -> None:
    """Writes what `read_rules` reads, atomically."""
    fields = [*(x for pair in paths for x in pair), *(x for k, v in door.items() for x in (f"door-{k}", v))]
    if nice:
        fields += ["nice", str(nice)]
    staged = path + ".new"
    with open(staged, "wb") as f:
        f.write(b"\0".join(os.fsencode(x) for x in fields))
    os.replace(staged, path)


def _cli(rules_path: str, argv: list[str]) -> int:
    import signal

    paths, door, nice = read_rules(rules_path)
    if nice:
        os.nice(nice)  # before the fork: the CLI, the door and every command it runs
    listener: _socket.socket | None = None
    if door:
        try:  # noqa: SIM105 - as in _end
            os.unlink(door["socket"])
        except FileNotFoundError:
            pass
        listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        listener.bind(_addressable(door["socket"]))
        os.chmod(door["socket"], 0o600)
        listener.listen(64)
    child = os.fork()
    if child == 0:
        try:
            if listener is not None:
                listener.close()
            libc: Any = _libc()
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() == 1:  # the parent died before the line above
                os._exit(137)
            restrict(paths)
            os.execv(argv[0], argv)
        except BaseException as err:  # the child never returns into the parent's code
            try:
                os.write(2, f"agent-rewind: the CLI could not be confined: {err}\n".encode())
            finally:
                os._exit(126)
    # The parent: out of the CLI's pipes (its reader sees their end when the CLI's is closed).
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, frame: os.kill(child, number))
    if listener is not None:
        import _thread

        _thread.start_new_thread(_door, (listener, door["program"], child))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
    for group in list(_RUNNING):
        _end(group)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _run(path: str, command: str) -> int:
    """One command, through the door: the CLI's side."""
    env = [b"%s=%s" % (k.encode(), os.fsencode(os.environ[k])) for k in _PASSED if k in os.environ]
    request = b"\0".join([os.fsencode(command), *env])
    streams = []
    for fd in (0, 1, 2):  # one the CLI left closed is /dev/null
        try:
            os.fstat(fd)
            streams.append(fd)
        except OSError:
            streams.append(os.open(os.devnull, os.O_RDWR))
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.connect(_addressable(path))
        rights = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("3i", *streams))]
        conn.sendmsg([_HEADER.pack(len(request))], rights)
        conn.sendall(request)
        status = b""
        while len(status) < _STATUS.size:
            chunk = conn.recv(_STATUS.size - len(status))
            if not chunk:
                raise ConnectionError("the door closed")
            status += chunk
        code = int(_STATUS.unpack(status)[0])
    except (OSError, ConnectionError) as err:
        os.write(2, f"agent-rewind: the command could not be run: {err}\n".encode())
        return 126
    finally:
        conn.close()
    return code


def main(args: list[str]) -> int:
    if args[:1] == ["abi"]:
        print(abi())
        return 0
    if len(args) >= 4 and args[0] == "cli" and args[2] == "--":
        return _cli(args[1], args[3:])
    if len(args) == 3 and args[0] == "run":
        return _run(args[1], args[2])
    if len(args) >= 4 and args[0] == "nice" and args[2] == "--" and args[1].isdigit():
        try:
            os.nice(int(args[1]))
            os.execv(args[3], args[3:])
        except OSError as err:
            os.write(2, f"agent-rewind: the CLI could not be started: {err}\n".encode())
            return 126
    os.write(
        2,
        b"usage: launcher.py cli RULES -- CLI [ARG...] | run SOCKET COMMAND | nice N -- CLI [ARG...] | abi\n",
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The supervisor every hook and tool command runs under: a tiny process between keel and the
command that makes the command's whole tree killable, whoever holds its pipes.

It runs as `python -I -S _reaper.py CTL_FD STATUS_FD KEEL_PID TERM_GRACE DRAIN_GRACE -- ARGV...`
(started by `keel.proc`, never imported; it imports only C modules, so it starts in ~15 ms) and:

- marks itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so every descendant that loses its
  parent (`sleep 300 &`, `(cmd &)`, `setsid cmd &`, `nohup cmd &`, a double fork) is re-parented
  to it rather than to init: its descendants are exactly the command's tree;
- starts ARGV in a process group of its own and closes its own copies of stdin/stdout/stderr;
- when ARGV exits, reports `x <status>` on STATUS_FD, waits at most DRAIN_GRACE seconds for the
  descendants it left behind, then kills them;
- on `k` from keel on CTL_FD, on EOF there (keel died), on SIGTERM (also its parent-death signal),
  kills the whole tree: SIGTERM, TERM_GRACE seconds, then SIGKILL to every descendant found in
  /proc, again and again until none is left;
- exits the way ARGV did (its exit code, or the same signal).

What it cannot stop: a process started on the command's behalf by something outside its tree (a
daemon it talks to: systemd-run, at, an already running tmux or docker server).
"""

from __future__ import annotations

import os
import select
import sys
import time

TYPE_CHECKING = False  # not typing's: importing typing costs start-up time
if TYPE_CHECKING:
    import signal
else:  # `signal` wraps this in enums, which cost a few ms of start-up per command
    import _signal as signal

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: However stubborn the tree, the supervisor gives up killing after this long.
KILL_CAP = 10.0


def _prctl(option: int, value: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux: the process group is all there is
        return False


def descendants(root: int) -> list[int]:
    """Every process below `root` in the process tree (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


class Supervisor:
    def __init__(self, ctl: int, status: int, term_grace: float, drain_grace: float) -> None:
        self.ctl = ctl  # keel writes `k` here; end of file means keel is gone
        self.status_fd = status
        self.term_grace = term_grace
        self.drain_grace = drain_grace
        self.me = os.getpid()
        self.child = 0
        self.status: int | None = None  # the waitpid status of the command, once it exited
        self.kill_requested = False

    def reap(self) -> bool:
        """Collect every exited child; False once there are no children left at all."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.child and self.status is None:
                self.status = status
                try:
                    os.write(self.status_fd, b"x %d\n" % status)
                except OSError:  # keel is gone
                    pass

    def signal_tree(self, sig: int) -> None:
        for pid in (-self.child, *descendants(self.me)):  # the command's group, then each one
            try:
                os.kill(pid, sig)
            except OSError:  # gone already
                pass

    def wait_gone(self, seconds: float) -> bool:
        """Reap until no child is left (True) or `seconds` pass (False)."""
        end = time.monotonic() + seconds
        while self.reap():
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)
        return True

    def kill_tree(self, grace: float) -> None:
        if grace > 0:
            self.signal_tree(signal.SIGTERM)
            if self.wait_gone(grace):
                return
        end = time.monotonic() + KILL_CAP
        while self.reap() and time.monotonic() < end:
            self.signal_tree(signal.SIGKILL)
            time.sleep(0.005)

    def on_ctl(self) -> None:
        try:
            data = os.read(self.ctl, 64)
        except OSError:
            data = b""
        if not data or b"k" in data:  # EOF: keel is gone
            self.kill_requested = True

    def run(self, argv: list[str], keel_pid: int) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "kill_requested", True))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != keel_pid:  # keel died before the death signal was armed
            sys.exit(125)
        try:
            self.child = os.posix_spawnp(
                argv[0],
                argv,
                os.environ,
                setpgroup=0,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM),
            )
        except OSError as exc:
            os.write(2, f"keel: cannot run {argv[0]}: {exc.strerror}\n".encode())
            sys.exit(127)
        # Hold none of the command's pipes: only the command's tree keeps them open.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        drain_end: float | None = None
        while True:
            if self.kill_requested:
                self.kill_tree(self.term_grace)
                break
            alive = self.reap()
            if not alive:
                break
            if self.status is not None and drain_end is None:
                drain_end = time.monotonic() + self.drain_grace
            if drain_end is not None and time.monotonic() >= drain_end:
                self.kill_tree(0)
                break
            timeout = None if drain_end is None else max(0.0, drain_end - time.monotonic())
            ready, _, _ = select.select([self.ctl, wake_r], [], [], timeout)
            if wake_r in ready:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
            if self.ctl in ready:
                self.on_ctl()
        self.reap()
        self.exit_like_child()

    def exit_like_child(self) -> None:
        status = self.status
        if status is None:
            os._exit(137)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            try:
                import resource

                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
                os.kill(self.me, sig)
            except (OSError, ValueError):  # a signal that cannot be re-raised: say it in the code
                pass
            os._exit(128 + sig)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def main(args: list[str]) -> None:
    ctl, status, keel_pid, term_grace, drain_grace, sep, *argv = args
    if sep != "--" or not argv:
        os.write(2, b"keel: _reaper: bad arguments\n")
        sys.exit(126)
    for fd in (int(ctl), int(status)):
        os.set_inheritable(fd, False)  # the command must not hold them
    Supervisor(int(ctl), int(status), float(term_grace), float(drain_grace)).run(
        argv, int(keel_pid)
    )


if __name__ == "__main__":
    main(sys.argv[1:])

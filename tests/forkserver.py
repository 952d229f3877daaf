"""Where each test process's `compose2sif` commands run (helpers.compose2sif_forked).

A test process runs compose2sif hundreds of times. A new interpreter costs ten times what the
command does, so each test process starts this small one (`python3 forkserver.py FD DIR`: the
modules of compose2sif, from DIR as the test process found it, imported and nothing else) and asks
it over the socket FD for each command: a length, then the pickled (argv, cwd, env, timeout), the
command's stdout and stderr files passed with it. It answers a wait status, as 8 bytes, and ends
when the socket closes.

How a command runs here:
- `config` and `convert` (IN_PROCESS) run in this process itself: each reads files and the
  environment it is given, writes its output directory and prints, and keeps nothing (no module of
  compose2sif keeps state between calls, changes the working directory or the environment, or
  installs a signal handler). A fork costs more than either: on this machine each page a child
  writes is a page fault and a copy, 10-15 ms a command, where a `config` takes 3 ms and a
  `convert` 30.
- Every other command (those that run run.sh, doctor, batch) is a fork of this process, as it
  would be a process of its own.
Both answer as a process would: the exit status, or killed by SIGALRM past the timeout.
Forking the test process itself would cost more again: it grows to 140 MB (pytest, hypothesis,
what the tests keep), and each fork copies its page tables and the pages the child writes."""
import gc
import os
import pickle
import signal
import socket
import struct
import sys
import traceback

STATUS = struct.Struct("!q")
IN_PROCESS = {"config", "convert"}


class _TimedOut(BaseException):
    """SIGALRM in a command that runs in this process: it ends there, as it would end a child."""


def _on_alarm(signum, frame):
    raise _TimedOut()


def _execute(argv, cwd, env, out_fd, err_fd) -> int:
    """What `python3 -m compose2sif ARGV` does in CWD with exactly ENV, its output to OUT_FD and
    ERR_FD: its exit code."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    from compose2sif.cli import main
    sys.argv = [os.path.join(os.path.dirname(sys.modules["compose2sif"].__file__), "__main__.py"), *argv]
    code = 1
    try:
        main()
        code = 0
    except SystemExit as end:  # as the interpreter ends on one
        if end.code is None or isinstance(end.code, int):
            code = end.code or 0
        else:
            print(end.code, file=sys.stderr)
            code = 1
    except _TimedOut:
        raise
    except BaseException:
        traceback.print_exc()  # as the interpreter does, "Traceback" and all
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def run_forked(argv, cwd, env, out_fd, err_fd, timeout) -> None:
    """The forked child: runs the command, then exits with its code; never returns. SIGALRM's
    default action ends it past the timeout."""
    code = 1
    try:
        signal.alarm(timeout)
        code = _execute(argv, cwd, env, out_fd, err_fd)
    finally:
        os._exit(code)


def run_here(argv, cwd, env, out_fd, err_fd, timeout) -> int:
    """The command in this process: the wait status a child running it would have left. What it
    changed (the standard streams, the directory, the environment) is put back."""
    saved_fds = [os.dup(fd) for fd in (0, 1, 2)]
    saved = (os.getcwd(), dict(os.environ), sys.argv, sys.stdin, sys.stdout, sys.stderr)
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.alarm(timeout)
        return (_execute(argv, cwd, env, out_fd, err_fd) & 0xff) << 8
    except _TimedOut:
        return signal.SIGALRM
    except Exception:  # before the command ran (CWD missing): a child would exit 1 so
        return 1 << 8
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        for fd, copy in enumerate(saved_fds):
            os.dup2(copy, fd)
            os.close(copy)
        os.chdir(saved[0])
        os.environ.clear()
        os.environ.update(saved[1])
        sys.argv, sys.stdin, sys.stdout, sys.stderr = saved[2:]


def _read_exactly(sock, size):
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def import_everything() -> None:
    """Every module of compose2sif but the registry client, once, here. The CLI imports most of
    them lazily, so a child that imported them itself would compile them again each time
    (PYTHONDONTWRITEBYTECODE, set on this machine, leaves no compiled copy beside the sources):
    100 ms of CPU a convert. The registry client pulls in requests, which no offline command
    needs and which would make this process a third larger, and each fork dearer. No module reads
    the environment or the working directory when imported."""
    import importlib
    import pkgutil
    import compose2sif
    for module in pkgutil.walk_packages(compose2sif.__path__, "compose2sif."):
        if module.name not in ("compose2sif.__main__", "compose2sif.registry"):  # __main__ runs the CLI
            importlib.import_module(module.name)


def _runs_here(argv, parser) -> bool:
    """Whether ARGV's command is one of IN_PROCESS, found as the CLI finds it."""
    from compose2sif.cli import _command_word
    return _command_word(parser, argv) in IN_PROCESS


def serve(sock) -> None:
    from compose2sif.cli import _parser
    import_everything()
    parser = _parser([])  # the global options, as the CLI reads them
    gc.collect()
    gc.freeze()  # what is here now, a child's collections leave alone (and so do not copy its pages)
    while True:
        try:
            header, fds, _, _ = socket.recv_fds(sock, STATUS.size, 2)
            if not header:
                return
            header += _read_exactly(sock, STATUS.size - len(header))
            argv, cwd, env, timeout = pickle.loads(_read_exactly(sock, STATUS.unpack(header)[0]))
        except EOFError:
            return
        if _runs_here(argv, parser):
            status = run_here(argv, cwd, env, fds[0], fds[1], timeout)
        else:
            pid = os.fork()
            if pid == 0:
                sock.close()
                run_forked(argv, cwd, env, fds[0], fds[1], timeout)
            _, status = os.waitpid(pid, 0)
        for fd in fds:
            os.close(fd)
        sock.sendall(STATUS.pack(status))


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[2])  # where the test process found compose2sif
    serve(socket.socket(fileno=int(sys.argv[1])))

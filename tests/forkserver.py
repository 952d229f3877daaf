"""Where each test process's `compose2sif` commands are forked from (helpers.compose2sif_forked).

A test process runs compose2sif hundreds of times. A new interpreter costs ten times what the
command does, so each command is a fork of a process that has compose2sif imported. Forking the
test process itself costs about 20 ms of CPU a command once it has grown (pytest, hypothesis, what
the tests keep: 140 MB), in copying its page tables and the pages a child writes. So each test
process starts this small one (`python3 forkserver.py FD DIR`: every module of compose2sif, from
DIR as the test process found it, imported and nothing else)
and asks it over the socket FD for each command: a length, then the pickled
(argv, cwd, env, timeout), the command's stdout and stderr files passed with it; it answers the
child's wait status, as 8 bytes. It ends when the socket closes."""
import gc
import os
import pickle
import signal
import socket
import struct
import sys
import traceback

STATUS = struct.Struct("!q")


def run_command(argv, cwd, env, out_fd, err_fd, timeout) -> None:
    """The forked child: what `python3 -m compose2sif ARGV` does in CWD with exactly ENV, its output
    to OUT_FD and ERR_FD, then its exit; never returns."""
    code = 1
    try:
        signal.alarm(timeout)  # its default action ends this process
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
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
        try:
            main()
            code = 0
        except SystemExit as end:  # as the interpreter ends on one
            if end.code is None or isinstance(end.code, int):
                code = end.code or 0
            else:
                print(end.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()  # as the interpreter does, "Traceback" and all
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _read_exactly(sock, size):
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def import_everything() -> None:
    """Every module of compose2sif, once, here. The CLI imports most of them lazily, so a child that
    imported them itself would compile them again each time (PYTHONDONTWRITEBYTECODE, set on this
    machine, leaves no compiled copy beside the sources): 100 ms of CPU a convert, where the convert
    itself is 25-35 ms. No module reads the environment or the working directory when imported."""
    import importlib
    import pkgutil
    import compose2sif
    for module in pkgutil.walk_packages(compose2sif.__path__, "compose2sif."):
        if not module.name.endswith(".__main__"):  # that one runs the CLI
            importlib.import_module(module.name)


def serve(sock) -> None:
    import_everything()
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
        pid = os.fork()
        if pid == 0:
            sock.close()
            run_command(argv, cwd, env, fds[0], fds[1], timeout)
        for fd in fds:
            os.close(fd)
        _, status = os.waitpid(pid, 0)
        sock.sendall(STATUS.pack(status))


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[2])  # where the test process found compose2sif
    serve(socket.socket(fileno=int(sys.argv[1])))

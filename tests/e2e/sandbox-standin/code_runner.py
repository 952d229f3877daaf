"""Stand-in for dify-sandbox's Code-node runner (dify-sandbox is not runnable here: Dify's images
cannot be pulled). It makes the calls dify-sandbox 0.2.15 makes before running a Code node
(internal/core/lib/python/add_seccomp.go): chroot(".") into the run directory, chdir("/"),
no_new_privs, setgroups([]), setgid(GID), setuid(UID); then it runs a line of "user code".
(dify-sandbox also installs a seccomp filter after no_new_privs: any process may do that once
no_new_privs is set, so it decides nothing here and is left out.)

    python3 code_runner.py RUN_DIR UID GID

Prints one line per call (`chroot ok`, `setuid EINVAL ...`), then `code ran as UID:GID` and exits
0 when every call succeeded, else exits 1 at the first failing call, like dify-sandbox does."""
import ctypes
import errno
import os
import sys

PR_SET_NO_NEW_PRIVS = 38
libc = ctypes.CDLL(None, use_errno=True)


def call(name, *args):
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        print(f"{name} {errno.errorcode.get(err, err)} {os.strerror(err)}", flush=True)
        sys.exit(1)
    print(f"{name} ok", flush=True)


def main():
    run_dir, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for name in ("uid_map", "gid_map", "setgroups"):
        with open(f"/proc/self/{name}") as fh:
            print(f"{name}: " + " | ".join(" ".join(line.split()) for line in fh.read().splitlines()), flush=True)
    os.chdir(run_dir)
    call("chroot", b".")
    call("chdir", b"/")
    call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    call("setgroups", 0, None)
    call("setgid", gid)
    call("setuid", uid)
    print(f"code ran as {os.getuid()}:{os.getgid()}", flush=True)  # the "user code"


if __name__ == "__main__":
    main()

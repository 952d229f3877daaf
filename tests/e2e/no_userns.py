"""Run a command with user namespaces blocked, as on a node whose admins turned them off (RHEL7's
default), without touching the machine's sysctl: a seccomp filter makes unshare(2) and clone(2)
with CLONE_NEWUSER fail with EPERM, and clone3(2) (whose flags a filter cannot read) fail with
ENOSYS, so that callers fall back to clone(2). Installed as root without no_new_privs, so that
setuid programs run under it keep their privileges (the setuid starter of Apptainer needs them).
x86_64 only.   no_userns.py COMMAND [ARG...]"""
import ctypes
import os
import struct
import sys

AUDIT_ARCH_X86_64 = 0xC000003E
NR_CLONE, NR_UNSHARE, NR_CLONE3 = 56, 272, 435
CLONE_NEWUSER = 0x10000000
EPERM, ENOSYS = 1, 38
LD_ABS, JEQ, JSET, RET = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
ALLOW, ERRNO = 0x7FFF0000, 0x00050000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2

# (code, jump if true, jump if false, k); jumps count the instructions skipped
PROGRAM = [
    (LD_ABS, 0, 0, 4),                   # 0: seccomp_data.arch
    (JEQ, 0, 6, AUDIT_ARCH_X86_64),      # 1: another ABI -> allow
    (LD_ABS, 0, 0, 0),                   # 2: seccomp_data.nr
    (JEQ, 6, 0, NR_CLONE3),              # 3: -> ENOSYS
    (JEQ, 1, 0, NR_UNSHARE),             # 4: -> flags
    (JEQ, 0, 2, NR_CLONE),               # 5: else -> allow
    (LD_ABS, 0, 0, 16),                  # 6: low word of args[0], the flags of both
    (JSET, 1, 0, CLONE_NEWUSER),         # 7: -> EPERM
    (RET, 0, 0, ALLOW),                  # 8
    (RET, 0, 0, ERRNO | EPERM),          # 9
    (RET, 0, 0, ERRNO | ENOSYS),         # 10
]


def block_user_namespaces() -> None:
    code = b"".join(struct.pack("HBBI", *ins) for ins in PROGRAM)
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxP", len(PROGRAM), ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


if __name__ == "__main__":
    block_user_namespaces()
    os.execvp(sys.argv[1], sys.argv[1:])

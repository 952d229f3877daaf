/* c2s-loopback's per-call phase function: pure, so tests/test_intercept.py compiles this header on
 * its own and drives it with the stop orders of old and new kernels. */
#ifndef C2S_LOOPBACK_PHASE_H
#define C2S_LOOPBACK_PHASE_H

/* Where a tracee stands in a call whose sockaddr was rewritten. From the seccomp stop the tracee
 * is resumed with PTRACE_SYSCALL. Kernels >= 4.8 run seccomp after the syscall-entry stop, so the
 * next syscall stop is the exit; kernels < 4.8 (RHEL7's 3.10) run it before, so the next syscall
 * stop is the entry, and the exit comes one PTRACE_SYSCALL later. */
enum phase { IDLE, AWAIT_ENTRY, AWAIT_EXIT, AT_EXIT, RESTARTED };
enum stop { STOP_SECCOMP, STOP_SYSCALL };

/* The next phase after a stop. STOP_SECCOMP with rewrite=0 in IDLE: nothing to do (resume with
 * PTRACE_CONT). AT_EXIT: the caller restores or restarts the call and resumes with PTRACE_CONT;
 * every other phase but IDLE resumes with PTRACE_SYSCALL. RESTARTED: the call was restarted with
 * an address already chosen; its seccomp stop is passed through without a new decision. */
static inline enum phase next_phase(enum phase phase, enum stop stop, int rewrite, int legacy)
{
    if (stop == STOP_SECCOMP) {
        if (phase == RESTARTED || rewrite)
            return legacy ? AWAIT_ENTRY : AWAIT_EXIT;
        return IDLE;
    }
    if (phase == AWAIT_ENTRY)
        return AWAIT_EXIT;
    if (phase == AWAIT_EXIT)
        return AT_EXIT;
    return IDLE; /* a syscall stop we did not ask for */
}

#endif

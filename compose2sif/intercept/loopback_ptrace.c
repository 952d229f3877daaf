/* c2s-loopback's ptrace side: the seccomp filter that makes bind, connect, sendto-with-an-address,
 * sendmsg and sendmmsg stop (with --private also accept and the receives that name a sender, and
 * read/readv/recv on a watched UDP socket, by a second filter), the tracees'
 * memory and registers, the table of tracees, and what the tracer does at a call's seccomp stop
 * (read, rewrite by the rules of loopback_rules.c, place the copy) and at its exit (restore,
 * restart with another address, or, for another user's connection or datagram, run it again). */
#include "loopback.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <unistd.h>

int legacy_order;
int share_ports;
int host_network;

/* ---- tracee memory and registers -------------------------------------------------------------- */

static int read_memory(pid_t tid, unsigned long addr, void *buf, size_t len)
{
    struct iovec local = {buf, len}, remote = {(void *)addr, len};
    if (process_vm_readv(tid, &local, 1, &remote, 1, 0) == (ssize_t)len)
        return 0;
    for (size_t off = 0; off < len; off += sizeof(long)) {  /* no CONFIG_CROSS_MEMORY_ATTACH */
        errno = 0;
        long word = ptrace(PTRACE_PEEKDATA, tid, addr + off, 0);
        if (errno)
            return -1;
        memcpy((char *)buf + off, &word, len - off < sizeof word ? len - off : sizeof word);
    }
    return 0;
}

/* Writes with process_vm_writev, which honours page protections, or with force through
 * PTRACE_POKEDATA, which writes a private copy of a read-only page as a debugger does. */
static int write_memory(pid_t tid, unsigned long addr, const void *buf, size_t len, int force)
{
    struct iovec local = {(void *)buf, len}, remote = {(void *)addr, len};
    if (!force)
        return process_vm_writev(tid, &local, 1, &remote, 1, 0) == (ssize_t)len ? 0 : -1;
    for (size_t off = 0; off < len; off += sizeof(long)) {
        long word;
        size_t n = len - off < sizeof word ? len - off : sizeof word;
        if (n < sizeof word) {
            errno = 0;
            word = ptrace(PTRACE_PEEKDATA, tid, addr + off, 0);
            if (errno)
                return -1;
        }
        memcpy(&word, (const char *)buf + off, n);
        if (ptrace(PTRACE_POKEDATA, tid, addr + off, word) < 0)
            return -1;
    }
    return 0;
}

/* a register as the C library declares it: unsigned long long in glibc, unsigned long in musl */
typedef __typeof__(((struct user_regs_struct *)0)->rsi) reg_t;

/* the sockaddr argument and its length: bind/connect(fd, addr, len), sendto(fd, buf, n, flags, addr,
 * len); sendmsg(fd, msg, flags) names it in its msghdr (on_seccomp_stop reads it), and rsi is the
 * msghdr's */
static reg_t *addr_register(struct user_regs_struct *r, long nr)
{
    return nr == SYS_sendto ? &r->r8 : &r->rsi;
}

static reg_t addr_length(const struct user_regs_struct *r, long nr)
{
    return nr == SYS_sendto ? r->r9 : r->rdx;
}

/* ---- tracees ---------------------------------------------------------------------------------- */

static struct tracee *tracees;
static size_t tracee_slots, tracee_count;

static size_t slot_of(pid_t tid, size_t slots) { return ((size_t)tid * 2654435761u) % slots; }

struct tracee *find_tracee(pid_t tid, int create)
{
    if (create && (tracee_count + 1) * 2 > tracee_slots) {
        size_t slots = tracee_slots ? 2 * tracee_slots : 64;
        struct tracee *table = calloc(slots, sizeof *table);
        if (!table) {
            fprintf(stderr, NAME ": out of memory\n");
            exit(EXIT_SETUP);
        }
        for (size_t i = 0; i < tracee_slots; i++) {
            if (!tracees[i].tid)
                continue;
            size_t j = slot_of(tracees[i].tid, slots);
            while (table[j].tid)
                j = (j + 1) % slots;
            table[j] = tracees[i];
        }
        free(tracees);
        tracees = table;
        tracee_slots = slots;
    }
    if (!tracee_slots)
        return NULL;
    size_t i = slot_of(tid, tracee_slots);
    while (tracees[i].tid) {
        if (tracees[i].tid == tid)
            return &tracees[i];
        i = (i + 1) % tracee_slots;
    }
    if (!create)
        return NULL;
    memset(&tracees[i], 0, sizeof tracees[i]);
    tracees[i].tid = tid;
    tracee_count++;
    return &tracees[i];
}

/* Removes a tracee (linear probing: later entries of the same run move up into the hole). */
void forget_tracee(pid_t tid)
{
    struct tracee *t = find_tracee(tid, 0);
    if (!t)
        return;
    size_t hole = (size_t)(t - tracees);
    tracees[hole].tid = 0;
    tracee_count--;
    for (size_t j = (hole + 1) % tracee_slots; tracees[j].tid; j = (j + 1) % tracee_slots) {
        size_t home = slot_of(tracees[j].tid, tracee_slots);
        int stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (!stays) {
            tracees[hole] = tracees[j];
            tracees[j].tid = 0;
            hole = j;
        }
    }
}

void resume(pid_t tid, int how, int sig)
{
    ptrace(how, tid, 0, (void *)(long)sig);  /* ESRCH: it died meanwhile; its exit comes next */
}

/* ---- the stops ------------------------------------------------------------------------------ */

/* Puts the rewritten sockaddr where the call will read it: below the red zone under the stack
 * pointer (never the program's own, possibly const, memory). Only process_vm_writev may write
 * there: it fails on a page the program could not write either (a guard page under a stack at its
 * very bottom), where a forced write would succeed and the call then fail with EFAULT. Failing
 * that, in place (forced through a read-only page), restored at the exit. */
static int place_copy(struct tracee *t, struct user_regs_struct *regs)
{
    unsigned long scratch = (regs->rsp - 128 - sizeof t->rewritten) & ~15UL;
    if (write_memory(t->tid, scratch, &t->rewritten, t->len, 0) == 0) {
        t->copy_ptr = scratch;
        return 0;
    }
    if (write_memory(t->tid, t->user_ptr, &t->rewritten, t->len, 1) == 0) {
        t->copy_ptr = t->user_ptr;
        return 0;
    }
    return -1;
}

/* sendmsg: a copy of its msghdr naming the rewritten sockaddr's copy, below that copy; its
 * address, or 0 where it cannot be written. */
static reg_t place_msghdr(struct tracee *t)
{
    struct msghdr m = t->msg;
    unsigned long at = (t->copy_ptr - sizeof m) & ~15UL;
    m.msg_name = (void *)t->copy_ptr;
    return write_memory(t->tid, at, &m, sizeof m, 0) == 0 ? at : 0;
}

/* sendmmsg, its count made 1: a copy of its first mmsghdr naming the rewritten sockaddr's copy,
 * below that copy (the kernel writes the sent length into it; finish_call copies that back); its
 * address, or 0 where it cannot be written. */
static reg_t place_mmsghdr(struct tracee *t)
{
    struct mmsghdr m = {.msg_hdr = t->msg};
    unsigned long at = (t->copy_ptr - sizeof m) & ~15UL;
    m.msg_hdr.msg_name = (void *)t->copy_ptr;
    t->header_copy = write_memory(t->tid, at, &m, sizeof m, 0) == 0 ? at : 0;
    return t->header_copy;
}

/* sendmmsg(fd, vec, vlen, flags): where any of its messages names an address, it is made to send
 * the first one only (the count put back at its exit: callers take fewer sent than asked, as a
 * full socket buffer gives), which goes as a sendmsg; the next call, with the rest, stops again.
 * Reads that first msghdr into t->msg; 0 where no message names an address. */
static int first_of_batch(struct tracee *t, struct user_regs_struct *regs)
{
    enum { BATCH = 64 };
    struct mmsghdr batch[BATCH];
    unsigned long long vlen = regs->rdx > 1024 ? 1024 : regs->rdx;
    int named = 0;
    for (unsigned long long i = 0; i < vlen && !named; i += BATCH) {
        size_t n = vlen - i < BATCH ? (size_t)(vlen - i) : BATCH;
        if (read_memory(t->tid, regs->rsi + i * sizeof batch[0], batch, n * sizeof batch[0]) != 0)
            return 0;  /* the kernel fails it with EFAULT as written */
        if (i == 0)
            t->msg = batch[0].msg_hdr;
        for (size_t j = 0; j < n; j++)
            named |= batch[j].msg_hdr.msg_name != NULL;
    }
    if (named && regs->rdx > 1) {
        t->vlen = regs->rdx;
        regs->rdx = 1;
    }
    return named;
}

/* Where a host-network service's bind asks for every address: 0.0.0.0 or [::]. */
static int wildcard(const union sockaddr_any *a)
{
    if (a->sa.sa_family == AF_INET)
        return a->in4.sin_addr.s_addr == htonl(INADDR_ANY);
    return !memcmp(&a->in6.sin6_addr, &in6addr_any, sizeof in6addr_any);
}

/* ---- --private: datagrams of other users ------------------------------------------------------ */

static int receives(long nr) { return nr == SYS_recvfrom || nr == SYS_recvmsg || nr == SYS_recvmmsg; }

/* The msghdr a recvmsg fills (at its second argument), or a recvmmsg its first (a struct mmsghdr
 * begins with one). */
static int read_msghdr(pid_t tid, const struct user_regs_struct *regs, struct msghdr *m)
{
    return read_memory(tid, regs->rsi, m, sizeof *m);
}

/* A receive that can say who sent the datagram (recvfrom with an address; recvmsg and recvmmsg
 * with a msg_name): its exit is stopped to look. The lengths the kernel overwrites are kept, to
 * run it again as the program called it. A recvmmsg takes one datagram per call (each is
 * looked at on its own): its count is put back at the exit. */
static void receiving(struct tracee *t, struct user_regs_struct *regs)
{
    t->nr = (long)regs->orig_rax;
    t->fd = (long)regs->rdi;
    t->vlen = 0;
    int wanted;
    if (t->nr == SYS_recvfrom) {
        wanted = read_memory(t->tid, regs->r9, &t->name_len, sizeof t->name_len) == 0;
    } else {
        struct msghdr m;
        wanted = read_msghdr(t->tid, regs, &m) == 0 && m.msg_name && m.msg_namelen;
        t->name_len = m.msg_namelen;
        t->control_len = m.msg_controllen;
        if (wanted && t->nr == SYS_recvmmsg && regs->rdx > 1) {
            t->vlen = regs->rdx;
            regs->rdx = 1;
            wanted = ptrace(PTRACE_SETREGS, t->tid, 0, regs) == 0;
        }
    }
    t->phase = next_phase(IDLE, STOP_SECCOMP, wanted, legacy_order);
    resume(t->tid, t->phase == IDLE ? PTRACE_CONT : PTRACE_SYSCALL, 0);
}

/* The sender of the datagram the receive got: 0, or -1 where it gave none of IPv4 or IPv6. */
static int sender_of(struct tracee *t, const struct user_regs_struct *regs, union sockaddr_any *from)
{
    unsigned long name;
    socklen_t len;
    if (t->nr == SYS_recvfrom) {
        name = regs->r8;
        if (read_memory(t->tid, regs->r9, &len, sizeof len) != 0)
            return -1;
    } else {
        struct msghdr m;
        if (read_msghdr(t->tid, regs, &m) != 0)
            return -1;
        name = (unsigned long)m.msg_name;
        len = m.msg_namelen;
    }
    memset(from, 0, sizeof *from);
    if (len < sizeof(struct sockaddr_in) || len > sizeof *from ||
        read_memory(t->tid, name, from, len) != 0)
        return -1;
    return from->sa.sa_family == AF_INET || (from->sa.sa_family == AF_INET6 && len >= 24) ? 0 : -1;
}

/* The receive's exit. A datagram another user's socket sent (loopback_owner.c) is dropped: the
 * lengths the kernel wrote are put back and the call runs again, waiting for the next one (a
 * non-blocking socket gets EAGAIN, as if it had never come). One only peeked at (MSG_PEEK) is
 * taken off the socket first, through the tracer's copy of it. */
static void received(struct tracee *t, struct user_regs_struct *regs)
{
    long ret = (long)regs->rax;
    reg_t flags = t->nr == SYS_recvmsg ? regs->rdx : regs->r10;
    union sockaddr_any from;
    t->phase = IDLE;
    if (t->vlen)
        regs->rdx = t->vlen;
    long unnamed = t->unnamed;
    t->unnamed = 0;
    if (unnamed && ret <= -512 && ret >= -516) {
        /* a signal came (-ERESTART...): the kernel runs the call again, or fails it with EINTR, as
         * the program called it: read again stops again */
        regs->orig_rax = t->saved.orig_rax;
        unnamed = -1;
    }
    int foreign = unnamed >= 0 && ret >= (t->nr == SYS_recvmmsg) && sender_of(t, regs, &from) == 0 &&
                  foreign_sender(t->tid, t->fd, &from, (flags & MSG_PEEK) != 0) == 1;
    if (unnamed) {  /* the read, readv or recv as the program called it: run again, or its result */
        reg_t result = regs->rax, orig = regs->orig_rax;
        *regs = t->saved;
        regs->orig_rax = orig;
        regs->rax = result;
        if (foreign) {
            regs->rip -= 2;
            regs->rax = regs->orig_rax = t->saved.orig_rax;
        }
    } else if (foreign) {
        int restored;
        if (t->nr == SYS_recvfrom) {
            restored = write_memory(t->tid, regs->r9, &t->name_len, sizeof t->name_len, 0) == 0;
        } else {
            struct msghdr m;
            restored = read_msghdr(t->tid, regs, &m) == 0;
            m.msg_namelen = t->name_len;
            m.msg_controllen = t->control_len;
            restored = restored && write_memory(t->tid, regs->rsi, &m, sizeof m, 0) == 0;
        }
        if (restored) {
            regs->rip -= 2;  /* the `syscall` instruction, as the program called it */
            regs->rax = regs->orig_rax;
        }
    }
    ptrace(PTRACE_SETREGS, t->tid, 0, regs);
    resume(t->tid, PTRACE_CONT, 0);
}

/* ---- --private: datagrams read without asking who sent them -------------------------------- */
/* read, readv and recv (recvfrom without an address) do not say the sender, and stopping every
 * read would cost every program (a TCP server reads with them). So after a UDP socket's bind to a
 * port (a server's socket; a client's, bound to port 0, is not watched), a second seccomp filter is
 * put into its process (a seccomp() run in the tracee, every thread: TSYNC), which stops those
 * three calls on that fd number alone; later children inherit it. At such a stop, where the fd is
 * still that socket (its inode), the call runs as the receive that names the sender (recvfrom; for
 * readv, recvmsg), into a sockaddr below the red zone, and its exit is looked at as received()
 * does; the program's registers are put back. A process gets at most FILTERS_PER_PROCESS such
 * filters (each costs every one of its system calls a few instructions). */

#define WATCHED_MAX 256
#define FILTERS_PER_PROCESS 16
static unsigned long watched_inodes[WATCHED_MAX];  /* the watched sockets; a ring, the oldest forgotten */
static size_t watched_next;
static struct { pid_t tgid; long fd; } filtered[WATCHED_MAX];  /* the fd numbers each process's filters stop */
static size_t filtered_next;

static unsigned long socket_inode(pid_t tid, long fd)
{
    char path[64], target[64];
    unsigned long inode = 0;
    snprintf(path, sizeof path, "/proc/%d/fd/%ld", tid, fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n > 0) {
        target[n] = 0;
        if (sscanf(target, "socket:[%lu]", &inode) != 1)
            inode = 0;
    }
    return inode;
}

static int watched(unsigned long inode)
{
    for (size_t i = 0; inode && i < WATCHED_MAX; i++)
        if (watched_inodes[i] == inode)
            return 1;
    return 0;
}

void forget_watches(pid_t tid)
{
    for (size_t i = 0; i < WATCHED_MAX; i++)
        if (filtered[i].tgid == tid)
            filtered[i].tgid = 0;
}

/* A UDP socket's bind to a port, by its seccomp stop's sockaddr: its fd is to be watched. */
static int watch_wanted(struct tracee *t)
{
    const union sockaddr_any *a = &t->rewritten;
    char proto[16];
    if (!private_only || t->nr != SYS_bind || !(a->sa.sa_family == AF_INET ? a->in4.sin_port : a->in6.sin6_port))
        return 0;
    socket_proto(t->tid, t->fd, proto, sizeof proto);
    return !strcmp(proto, "UDP") || !strcmp(proto, "UDPv6");
}

/* After that bind succeeded: seccomp(SET_MODE_FILTER, TSYNC, prog) run in the tracee (the
 * `syscall` instruction run again with its number; the program below the stack's red zone) where
 * its process has no filter for that fd number yet; 1 where it was injected. */
static int inject_watch(struct tracee *t, struct user_regs_struct *regs)
{
    static int said;
    unsigned long inode = socket_inode(t->tid, t->fd);
    if (!inode)
        return 0;
    if (!watched(inode)) {
        watched_inodes[watched_next] = inode;
        watched_next = (watched_next + 1) % WATCHED_MAX;
    }
    pid_t tgid = tgid_of(t->tid);
    int count = 0;
    for (size_t i = 0; i < WATCHED_MAX; i++) {
        if (filtered[i].tgid != tgid)
            continue;
        if (filtered[i].fd == t->fd)
            return 0;  /* that fd number is stopped already */
        count++;
    }
    if (count >= FILTERS_PER_PROCESS) {
        if (!said++)
            fprintf(stderr, NAME ": process %d binds more than %d UDP sockets: datagrams the others read "
                    "without asking the sender (read, recv) are not checked for their sender's user\n",
                    (int)tgid, FILTERS_PER_PROCESS);
        return 0;
    }
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 6),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_read, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_readv, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_recvfrom, 0, 2),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)t->fd, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),
    };
    unsigned long at = (regs->rsp - 128 - sizeof code) & ~15UL, prog_at = at - 16;
    struct sock_fprog prog = {sizeof code / sizeof code[0], (struct sock_filter *)at};
    if (write_memory(t->tid, at, code, sizeof code, 0) != 0 || write_memory(t->tid, prog_at, &prog, sizeof prog, 0) != 0)
        return 0;
    t->saved = *regs;
    regs->rax = SYS_seccomp;
    regs->rdi = SECCOMP_SET_MODE_FILTER;
    regs->rsi = SECCOMP_FILTER_FLAG_TSYNC;
    regs->rdx = prog_at;
    regs->rip -= 2;
    if (ptrace(PTRACE_SETREGS, t->tid, 0, regs) != 0) {
        *regs = t->saved;
        return 0;
    }
    t->watching = 1;
    resume(t->tid, PTRACE_SYSCALL, 0);
    return 1;
}

int on_watching_stop(struct tracee *t)
{
    if (!t->watching)
        return 0;
    if (t->watching == 1) {  /* the injected seccomp()'s entry */
        t->watching = 2;
        resume(t->tid, PTRACE_SYSCALL, 0);
        return 1;
    }
    struct user_regs_struct regs;
    t->watching = 0;
    if (ptrace(PTRACE_GETREGS, t->tid, 0, &regs) == 0) {
        long ret = (long)regs.rax;
        if (ret == 0) {
            filtered[filtered_next].tgid = tgid_of(t->tid);
            filtered[filtered_next].fd = t->fd;
            filtered_next = (filtered_next + 1) % WATCHED_MAX;
        } else {  /* a thread with filters of its own (TSYNC gives its id), or seccomp refused */
            fprintf(stderr, NAME ": datagrams that fd %ld of process %d reads without asking the sender "
                    "(read, recv) are not checked for their sender's user (seccomp: %s)\n", t->fd,
                    (int)tgid_of(t->tid), ret > 0 ? "a thread has filters of its own" : strerror((int)-ret));
        }
    }
    regs = t->saved;  /* the bind's exit, as the program sees it */
    ptrace(PTRACE_SETREGS, t->tid, 0, &regs);
    t->phase = IDLE;
    resume(t->tid, PTRACE_CONT, 0);
    return 1;
}

/* A read, readv or recv the watch filter stopped: where its fd is a watched socket, it runs as
 * recvfrom (recvmsg for readv) with an address below the red zone, for received() to look at. */
static void unnamed_receiving(struct tracee *t, struct user_regs_struct *regs)
{
    long nr = (long)regs->orig_rax;
    t->fd = (long)regs->rdi;
    t->vlen = 0;
    t->unnamed = 0;
    t->phase = IDLE;
    if (!watched(socket_inode(t->tid, t->fd))) {  /* that fd number is something else now */
        resume(t->tid, PTRACE_CONT, 0);
        return;
    }
    unsigned long name = (regs->rsp - 128 - sizeof(union sockaddr_any)) & ~15UL, len_at = name - 16,
                  header = (len_at - sizeof(struct msghdr)) & ~15UL;
    socklen_t len = sizeof(union sockaddr_any);
    struct user_regs_struct as_called = *regs;
    int placed = write_memory(t->tid, len_at, &len, sizeof len, 0) == 0;
    t->name_len = len;
    t->control_len = 0;
    if (nr == SYS_readv) {
        struct msghdr m = {.msg_name = (void *)name, .msg_namelen = len, .msg_iov = (struct iovec *)regs->rsi,
                           .msg_iovlen = regs->rdx};
        placed = placed && write_memory(t->tid, header, &m, sizeof m, 0) == 0;
        t->nr = SYS_recvmsg;
        regs->rsi = header;
        regs->rdx = 0;
    } else {
        t->nr = SYS_recvfrom;
        if (nr == SYS_read)
            regs->r10 = 0;
        regs->r8 = name;
        regs->r9 = len_at;
    }
    regs->orig_rax = (reg_t)t->nr;
    if (placed && ptrace(PTRACE_SETREGS, t->tid, 0, regs) == 0) {
        t->saved = as_called;
        t->unnamed = nr;
        t->phase = next_phase(IDLE, STOP_SECCOMP, 1, legacy_order);
    }
    resume(t->tid, t->phase == IDLE ? PTRACE_CONT : PTRACE_SYSCALL, 0);
}

void on_seccomp_stop(struct tracee *t)
{
    struct user_regs_struct regs;
    if (ptrace(PTRACE_GETREGS, t->tid, 0, &regs) < 0)
        return;
    int rewrite = 0;
    if (regs.orig_rax == SYS_accept || regs.orig_rax == SYS_accept4) {  /* --private: its exit shows the peer */
        t->nr = (long)regs.orig_rax;
        t->phase = next_phase(IDLE, STOP_SECCOMP, 1, legacy_order);
        resume(t->tid, PTRACE_SYSCALL, 0);
        return;
    }
    if (regs.orig_rax == SYS_read || regs.orig_rax == SYS_readv || (regs.orig_rax == SYS_recvfrom && !regs.r8)) {
        unnamed_receiving(t, &regs);  /* --private: a watched UDP socket's fd number (inject_watch) */
        return;
    }
    if (receives((long)regs.orig_rax)) {  /* --private: its exit shows the sender */
        t->unnamed = 0;
        receiving(t, &regs);
        return;
    }
    if (t->phase != RESTARTED) {
        t->nr = (long)regs.orig_rax;
        t->fd = (long)regs.rdi;
        t->user_ptr = t->register_value = *addr_register(&regs, t->nr);
        t->copy_ptr = t->header_copy = 0;
        t->vlen = 0;
        t->len = 0;
        reg_t len = addr_length(&regs, t->nr);
        if (t->nr == SYS_sendmsg || t->nr == SYS_sendmmsg) {  /* the (first) msghdr's msg_name; none: as written */
            if (t->nr == SYS_sendmsg ? read_memory(t->tid, regs.rsi, &t->msg, sizeof t->msg) != 0
                                     : !first_of_batch(t, &regs))
                t->msg.msg_name = NULL;
            t->user_ptr = (unsigned long)t->msg.msg_name;
            len = t->msg.msg_namelen;
        }
        t->parked = 0;
        t->retries = 0;
        t->shared = 0;
        t->watch_bind = 0;
        if (t->user_ptr && len >= sizeof(struct sockaddr_in) && len <= sizeof t->original) {
            t->len = (socklen_t)len;
            memset(&t->original, 0, sizeof t->original);
            if (read_memory(t->tid, t->user_ptr, &t->original, t->len) == 0) {
                int family_ok = t->original.sa.sa_family == AF_INET ||
                                (t->original.sa.sa_family == AF_INET6 && len >= 24);
                t->rewritten = t->original;
                int relocated = family_ok && !host_network && relocate(&t->rewritten, t->nr == SYS_bind, t->tid, t->fd);
                int err = family_ok && !host_network && t->nr != SYS_bind ? refusal(&t->rewritten) : 0;
                /* its socket to share the port: --share-ports, any IPv4/IPv6 bind (relocated to its own
                 * address, mostly); --host-network, a wildcard bind */
                if (family_ok && t->nr == SYS_bind && (host_network ? wildcard(&t->original) : share_ports))
                    t->shared = 1;
                t->watch_bind = family_ok && watch_wanted(t);
                if (err) {  /* not on a network of the service: the call is skipped and fails */
                    if (t->vlen)
                        regs.rdx = t->vlen;
                    t->vlen = 0;
                    regs.orig_rax = (reg_t)-1;
                    regs.rax = (reg_t)-err;
                    if (ptrace(PTRACE_SETREGS, t->tid, 0, &regs) == 0) {
                        refused_once(&t->rewritten, err);
                        t->phase = IDLE;
                        resume(t->tid, PTRACE_CONT, 0);
                        return;
                    }
                }
                rewrite = relocated && place_copy(t, &regs) == 0;
                if (rewrite && t->copy_ptr != t->user_ptr) {
                    *addr_register(&regs, t->nr) = t->nr == SYS_sendmsg ? place_msghdr(t) :
                                                   t->nr == SYS_sendmmsg ? place_mmsghdr(t) : t->copy_ptr;
                    if (!*addr_register(&regs, t->nr) || ptrace(PTRACE_SETREGS, t->tid, 0, &regs) < 0)
                        rewrite = 0;
                }
                if (!rewrite) {  /* the call goes as written (its exit may still be wanted: t->shared) */
                    t->rewritten = t->original;
                    t->copy_ptr = 0;
                }
            }
        }
    }
    if (t->vlen && t->phase != RESTARTED && ptrace(PTRACE_SETREGS, t->tid, 0, &regs) < 0)
        t->vlen = 0;  /* its count as the program gave it */
    t->phase = next_phase(t->phase, STOP_SECCOMP, rewrite || t->shared == 1 || t->vlen || t->watch_bind,
                          legacy_order);
    resume(t->tid, t->phase == IDLE ? PTRACE_CONT : PTRACE_SYSCALL, 0);
}

/* Restarts the call that just returned, with the tracee's rewritten sockaddr as it now is. */
static void restart_call(struct tracee *t, struct user_regs_struct *regs)
{
    if (t->copy_ptr)
        write_memory(t->tid, t->copy_ptr, &t->rewritten, t->len, t->copy_ptr == t->user_ptr);
    regs->rip -= 2;  /* the `syscall` instruction */
    regs->rax = regs->orig_rax;
    ptrace(PTRACE_SETREGS, t->tid, 0, regs);
    t->phase = RESTARTED;
}

/* An accept that returned a connection of another user's: close() injected in its place (the
 * `syscall` instruction run again with close's number), and the accept run again after it. */
static void accepted(struct tracee *t, struct user_regs_struct *regs)
{
    long fd = (long)regs->rax;
    t->phase = IDLE;
    if (fd >= 0 && foreign_peer(t->tid, fd)) {
        t->saved = *regs;
        regs->rax = SYS_close;
        regs->rdi = (reg_t)fd;
        regs->rip -= 2;
        if (ptrace(PTRACE_SETREGS, t->tid, 0, regs) == 0) {
            t->closing = 1;
            resume(t->tid, PTRACE_SYSCALL, 0);
            return;
        }
    }
    resume(t->tid, PTRACE_CONT, 0);
}

int on_closing_stop(struct tracee *t)
{
    if (!t->closing)
        return 0;
    if (t->closing == 1) {  /* the injected close's entry */
        t->closing = 2;
        resume(t->tid, PTRACE_SYSCALL, 0);
        return 1;
    }
    struct user_regs_struct regs = t->saved;  /* its exit: the accept again, as the program called it */
    regs.rip -= 2;
    regs.rax = regs.orig_rax;
    t->closing = 0;
    ptrace(PTRACE_SETREGS, t->tid, 0, &regs);
    resume(t->tid, PTRACE_CONT, 0);
    return 1;
}

/* --share-ports, --host-network: after such a bind (t->shared, set at its seccomp stop),
 * succeeded or refused with EADDRINUSE, setsockopt(SO_REUSEPORT, 1) is
 * injected (the `syscall` instruction run again with its number; the 1 below the stack's red
 * zone, under the rewritten sockaddr's copy). The kernel then lets the wildcard listener and
 * the own-address ones of this user share the port, and sends each connection to the listener
 * of its exact address first: the own addresses keep theirs, as each container keeps its own
 * under Docker. A bind that failed with EADDRINUSE runs once more after it (on_sharing_stop). */
static int inject_share(struct tracee *t, struct user_regs_struct *regs)
{
    static const int one = 1;
    unsigned long flag = ((regs->rsp - 128 - sizeof t->rewritten) & ~15UL) - 16;
    if (write_memory(t->tid, flag, &one, sizeof one, 0) != 0)
        return 0;
    t->saved = *regs;
    regs->rax = SYS_setsockopt;
    regs->rdi = (reg_t)t->fd;
    regs->rsi = SOL_SOCKET;
    regs->rdx = SO_REUSEPORT;
    regs->r10 = flag;
    regs->r8 = sizeof one;
    regs->rip -= 2;
    if (ptrace(PTRACE_SETREGS, t->tid, 0, regs) != 0) {
        *regs = t->saved;
        return 0;
    }
    t->sharing = 1;
    t->shared = 2;
    resume(t->tid, PTRACE_SYSCALL, 0);
    return 1;
}

static void finish_call(struct tracee *t, struct user_regs_struct *regs);

int on_sharing_stop(struct tracee *t)
{
    if (!t->sharing)
        return 0;
    if (t->sharing == 1) {  /* the injected setsockopt's entry */
        t->sharing = 2;
        resume(t->tid, PTRACE_SYSCALL, 0);
        return 1;
    }
    struct user_regs_struct regs = t->saved;  /* its exit: the bind's own exit again */
    t->sharing = 0;
    ptrace(PTRACE_SETREGS, t->tid, 0, &regs);
    if ((long)regs.rax == -EADDRINUSE) {  /* once more, now that its socket shares the port */
        restart_call(t, &regs);
        resume(t->tid, PTRACE_CONT, 0);
        return 1;
    }
    finish_call(t, &regs);
    return 1;
}

void on_call_exit(struct tracee *t)
{
    struct user_regs_struct regs;
    if (ptrace(PTRACE_GETREGS, t->tid, 0, &regs) < 0)
        return;
    if (t->nr == SYS_accept || t->nr == SYS_accept4) {
        accepted(t, &regs);
        return;
    }
    if (receives(t->nr)) {
        received(t, &regs);
        return;
    }
    long ret = (long)regs.rax;
    int bind = t->nr == SYS_bind;
    int v6 = t->original.sa.sa_family == AF_INET6;

    if (bind && v6 && ret == -EINVAL && !t->parked) {
        /* an IPV6_V6ONLY socket refuses a v4-mapped address and there is no per-service IPv6
         * loopback: park it on [::1] at a port of the kernel's choosing (the program's IPv4
         * socket, if it has one, serves). */
        t->parked = 1;
        memset(&t->rewritten.in6.sin6_addr, 0, sizeof(struct in6_addr));
        t->rewritten.in6.sin6_addr = v6_loopback;
        t->rewritten.in6.sin6_port = 0;
        restart_call(t, &regs);
        resume(t->tid, PTRACE_CONT, 0);
        return;
    }
    uint16_t port = ntohs(v6 ? t->original.in6.sin6_port : t->original.in4.sin_port);
    if (bind && ret == -EADDRINUSE && !t->parked && port && port < 1024 && privileged_from_block[port] &&
        t->retries < 16) {
        /* the block's port is taken (by someone outside the service): take the next one */
        privileged_to[port] = 0;
        uint16_t to = relocate_privileged(port);
        if (to) {
            t->retries++;
            if (v6)
                t->rewritten.in6.sin6_port = htons(to);
            else
                t->rewritten.in4.sin_port = htons(to);
            restart_call(t, &regs);
            resume(t->tid, PTRACE_CONT, 0);
            return;
        }
    }
    if (!bind && v6 && (ret == -ENETUNREACH || ret == -EAFNOSUPPORT || ret == -EINVAL) &&
        memcmp(&t->rewritten, &t->original, t->len) != 0) {
        /* an IPv6-only socket cannot reach a v4-mapped address: let the call go as written */
        t->rewritten = t->original;
        restart_call(t, &regs);
        resume(t->tid, PTRACE_CONT, 0);
        return;
    }
    if (bind && t->shared == 1 && (ret == 0 || ret == -EADDRINUSE) && inject_share(t, &regs))
        return;
    finish_call(t, &regs);
}

/* The call's exit as the program sees it: its sockaddr argument as it passed it, the relocation
 * recorded. */
static void finish_call(struct tracee *t, struct user_regs_struct *regs)
{
    long ret = (long)regs->rax;
    int bind = t->nr == SYS_bind;
    if (t->copy_ptr && t->copy_ptr == t->user_ptr)
        write_memory(t->tid, t->user_ptr, &t->original, t->len, 1);
    else if (t->copy_ptr) {
        unsigned int sent;  /* sendmmsg: the length the kernel wrote into the copy, where the program looks */
        if (t->header_copy && read_memory(t->tid, t->header_copy + offsetof(struct mmsghdr, msg_len), &sent,
                                          sizeof sent) == 0)
            write_memory(t->tid, t->register_value + offsetof(struct mmsghdr, msg_len), &sent, sizeof sent, 0);
        *addr_register(regs, t->nr) = t->register_value;
    }
    if (t->vlen)
        regs->rdx = t->vlen;
    if ((t->copy_ptr && t->copy_ptr != t->user_ptr) || t->vlen)
        ptrace(PTRACE_SETREGS, t->tid, 0, regs);
    t->vlen = 0;
    if ((ret >= 0 || ret == -EINPROGRESS) && memcmp(&t->rewritten, &t->original, t->len) != 0)
        record(t->parked ? "park" : bind ? "bind" : t->nr == SYS_connect ? "connect" :
               t->nr == SYS_sendmsg ? "sendmsg" : t->nr == SYS_sendmmsg ? "sendmmsg" : "sendto", t->tid, t->fd,
               &t->original, &t->rewritten);
    if (bind && ret == 0 && t->watch_bind && inject_watch(t, regs))
        return;
    t->phase = IDLE;
    resume(t->tid, PTRACE_CONT, 0);
}

/* ---- the seccomp filter ------------------------------------------------------------------------ */

int install_filter(void)
{
    /* accept, accept4 and the receives stop only under --private (no system call has the other
     * number) */
    const uint32_t nothing = 0x7ffffff0, accept_nr = private_only ? SYS_accept : nothing,
                   accept4_nr = private_only ? SYS_accept4 : nothing,
                   recvmsg_nr = private_only ? SYS_recvmsg : nothing,
                   recvmmsg_nr = private_only ? SYS_recvmmsg : nothing,
                   recvfrom_nr = private_only ? SYS_recvfrom : nothing,
                   /* --host-network: only its binds (the node's network is its own) */
                   connect_nr = host_network ? nothing : SYS_connect, sendto_nr = host_network ? nothing : SYS_sendto,
                   sendmsg_nr = host_network ? nothing : SYS_sendmsg, sendmmsg_nr = host_network ? nothing : SYS_sendmmsg;
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),  /* i386 processes: not relocated */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        /* io_uring's rings make connects, accepts and sends no filter sees: refused, as Docker's
         * default seccomp profile refuses them (moby#46762); programs fall back to epoll */
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, SYS_io_uring_setup, 0, 2),
        BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, SYS_io_uring_register, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_bind, 16, 0),      /* -> trace */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, connect_nr, 15, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, sendmsg_nr, 14, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, sendmmsg_nr, 13, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, accept_nr, 12, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, accept4_nr, 11, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, recvmsg_nr, 10, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, recvmmsg_nr, 9, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, sendto_nr, 2, 0),      /* -> its address */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, recvfrom_nr, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* sendto and recvfrom without an address (send() on a connected socket, recv()): no stop */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[4])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[4]) + 4),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),              /* trace */
    };
    struct sock_fprog prog = {sizeof code / sizeof code[0], code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

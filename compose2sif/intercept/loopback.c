/* c2s-loopback: run a command with a per-service virtual loopback.
 *
 *   c2s-loopback --addr 127.A.B.C [--block LO-HI] [--map P:Q]... [--keep P]... [--record FILE]
 *                [--peers DIR] -- COMMAND [ARG]...
 *   c2s-loopback --check [--addr 127.A.B.C]     (exit 0: works here; 1 and one line: why not)
 *
 * For COMMAND and every process and thread it starts, bind/connect/sendto are relocated:
 *   - bind to 0.0.0.0, ::, 127.0.0.1, ::1 (or the service's own address) on port P goes to the
 *     service's own address on P (::ffff:127.A.B.C on AF_INET6 sockets); a privileged P (< 1024)
 *     goes to the port --map gives, else to the next port of --block;
 *   - connect/sendto to 127.0.0.1, ::1, ::ffff:127.0.0.1, 0.0.0.0 or :: go to the own address,
 *     a relocated privileged port to where it went; a privileged port of another 127.x address
 *     goes where that service's record (a file in --peers) says it went;
 *   - binds and connects of the service itself on a --keep port (one published on its own number,
 *     which the node's clients reach on every address, as Docker publishes it) are left as written;
 *   - everything else is untouched.
 * Each distinct relocation is appended once to --record, one line: KIND PROTO FROM TO. A tracer
 * started beside the service's entry (a healthcheck, an exec) with the same --record finds the
 * privileged ports the entry relocated there.
 *
 * How: a seccomp filter (inherited by every descendant) returns SECCOMP_RET_TRACE for bind,
 * connect and sendto-with-an-address only; this process is their ptrace tracer (PTRACE_SEIZE, so
 * group stops and SIGCONT behave; clones, forks, vforks and execs are followed). At the seccomp
 * stop the sockaddr is read, the rewritten copy written below the tracee's stack red zone and the
 * argument register pointed at it; at the syscall-exit stop the register is put back (libc assumes
 * argument registers survive a syscall) or, for a few failures, the call is restarted with another
 * address. Other system calls never stop.
 *
 * Exit status passes through: COMMAND's exit code, or its killing signal re-raised here (without
 * a core of our own: COMMAND dumps its core as it would untraced). Signals sent to this process
 * by another process are forwarded to COMMAND; terminal signals reach COMMAND's process group
 * directly. The tracer exiting kills what is left of the tree (PTRACE_O_EXITKILL), as a container
 * runtime does when its main process ends.
 *
 * Exit codes of its own: 125 setup failure (one line on stderr), 126/127 COMMAND not executable /
 * not found. Linux >= 3.8 (EXITKILL), x86_64.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#if !defined(__x86_64__)
#error "c2s-loopback: only x86_64 is implemented (aarch64 needs PTRACE_GETREGSET, x0 restore, 4-byte svc)"
#endif

#ifndef PTRACE_EVENT_STOP
#define PTRACE_EVENT_STOP 128
#endif

#define NAME "c2s-loopback"
#define EXIT_SETUP 125

/* ---- configuration ------------------------------------------------------------------------ */

static struct in_addr own_addr;          /* the service's own address, 127.A.B.C */
static uint16_t privileged_to[1024];     /* privileged port -> relocated port (0: not yet) */
static int privileged_from_block[1024];  /* the relocation came from --block (may be retried) */
static uint16_t block_lo, block_hi, block_next;
static unsigned char kept[65536];        /* --keep: ports left as the program writes them */
static int record_fd = -1;
static const char *peers_dir;
static int legacy_order;                 /* kernel < 4.8: seccomp stop before syscall-entry stop */

/* ---- the per-call state machine (pure; tests/intercept_state_test.c drives it) --------------- */

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
static enum phase next_phase(enum phase phase, enum stop stop, int rewrite, int legacy)
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

/* ---- addresses ------------------------------------------------------------------------------ */

union sockaddr_any {
    struct sockaddr sa;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    struct sockaddr_storage storage;
};

static const struct in6_addr v6_any = IN6ADDR_ANY_INIT, v6_loopback = IN6ADDR_LOOPBACK_INIT;

static int v4_mapped(const struct in6_addr *a, struct in_addr *out)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(a->s6_addr, prefix, 12) != 0)
        return 0;
    memcpy(&out->s_addr, a->s6_addr + 12, 4);
    return 1;
}

static void set_v4_mapped(struct in6_addr *a, struct in_addr v4)
{
    memset(a->s6_addr, 0, 10);
    a->s6_addr[10] = a->s6_addr[11] = 0xff;
    memcpy(a->s6_addr + 12, &v4.s_addr, 4);
}

static int is_v4(struct in_addr a, const char *dotted)
{
    struct in_addr b;
    inet_pton(AF_INET, dotted, &b);
    return a.s_addr == b.s_addr;
}

/* "1.2.3.4:80" or "[::1]:80" */
static void format_addr(const union sockaddr_any *a, char *out, size_t size)
{
    char host[INET6_ADDRSTRLEN];
    if (a->sa.sa_family == AF_INET) {
        inet_ntop(AF_INET, &a->in4.sin_addr, host, sizeof host);
        snprintf(out, size, "%s:%u", host, ntohs(a->in4.sin_port));
    } else {
        inet_ntop(AF_INET6, &a->in6.sin6_addr, host, sizeof host);
        snprintf(out, size, "[%s]:%u", host, ntohs(a->in6.sin6_port));
    }
}

/* ---- privileged ports ----------------------------------------------------------------------- */

static int port_taken_by_map(uint16_t port)
{
    for (int p = 1; p < 1024; p++)
        if (privileged_to[p] == port)
            return 1;
    return 0;
}

/* The port privileged port P goes to, allocating from --block on first use; 0 when none is left. */
static uint16_t peer_port(struct in_addr addr, uint16_t port);

static uint16_t relocate_privileged(uint16_t port)
{
    if (privileged_to[port])
        return privileged_to[port];
    if ((privileged_to[port] = peer_port(own_addr, port)))  /* the service's entry took it already */
        return privileged_to[port];
    while (block_next && block_next <= block_hi) {
        uint16_t candidate = block_next++;
        if (!port_taken_by_map(candidate)) {
            privileged_to[port] = candidate;
            privileged_from_block[port] = 1;
            return candidate;
        }
    }
    return 0;
}

/* ---- relocations made by other tracers: other services' (their records in --peers) and this
 * service's own entry, when this tracer runs a healthcheck or an exec beside it (--record) ---- */

struct peer { struct in_addr addr; uint16_t from, to; };
static struct peer *peers;
static size_t n_peers, peers_capacity;
static struct timespec peers_read_at;
static const char *record_path;

static int parse_endpoint(char *text, struct in_addr *addr, uint16_t *port)
{
    char *colon = strrchr(text, ':');
    if (!colon)
        return 0;
    *colon = 0;
    *port = (uint16_t)atoi(colon + 1);
    if (text[0] == '[') {
        struct in6_addr a6;
        text[strlen(text) - 1] = 0;
        return inet_pton(AF_INET6, text + 1, &a6) == 1 && v4_mapped(&a6, addr);
    }
    return inet_pton(AF_INET, text, addr) == 1;
}

/* Takes the privileged-port binds of a record: "bind PROTO FROM TO". */
static void read_record(int dir_fd, const char *path)
{
    int fd = openat(dir_fd, path, O_RDONLY | O_CLOEXEC);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0)
            close(fd);
        return;
    }
    char kind[16], proto[16], from[80], to[80], line[256];
    while (fgets(line, sizeof line, f)) {
        struct peer p;
        struct in_addr from_addr;
        if (sscanf(line, "%15s %15s %79s %79s", kind, proto, from, to) != 4 || strcmp(kind, "bind") != 0)
            continue;
        if (!parse_endpoint(from, &from_addr, &p.from) || !parse_endpoint(to, &p.addr, &p.to))
            continue;
        if (p.from == 0 || p.from >= 1024 || p.from == p.to)
            continue;
        if (n_peers == peers_capacity) {
            size_t capacity = peers_capacity ? 2 * peers_capacity : 16;
            struct peer *grown = realloc(peers, capacity * sizeof *peers);
            if (!grown)
                break;
            peers = grown;
            peers_capacity = capacity;
        }
        peers[n_peers++] = p;
    }
    fclose(f);
}

static void read_peers(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long elapsed_ms = (now.tv_sec - peers_read_at.tv_sec) * 1000 + (now.tv_nsec - peers_read_at.tv_nsec) / 1000000;
    if (peers_read_at.tv_sec && elapsed_ms < 200)  /* a miss rereads at most five times a second */
        return;
    peers_read_at = now;
    n_peers = 0;
    if (record_path)
        read_record(AT_FDCWD, record_path);
    DIR *dir = peers_dir ? opendir(peers_dir) : NULL;
    if (!dir)
        return;
    struct dirent *entry;
    while ((entry = readdir(dir)))
        if (entry->d_name[0] != '.')
            read_record(dirfd(dir), entry->d_name);
    closedir(dir);
}

static uint16_t peer_port(struct in_addr addr, uint16_t port)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        for (size_t i = 0; i < n_peers; i++)
            if (peers[i].addr.s_addr == addr.s_addr && peers[i].from == port)
                return peers[i].to;
        if (attempt == 0)
            read_peers();
    }
    return 0;
}

/* ---- the decision ---------------------------------------------------------------------------- */

/* Rewrites *a in place for a bind (is_bind) or a connect/sendto; returns 1 when it changed. */
static int relocate(union sockaddr_any *a, int is_bind)
{
    struct in_addr v4;
    uint16_t port;
    int v6 = a->sa.sa_family == AF_INET6;
    if (a->sa.sa_family == AF_INET) {
        v4 = a->in4.sin_addr;
        port = ntohs(a->in4.sin_port);
    } else if (v6) {
        const struct in6_addr *a6 = &a->in6.sin6_addr;
        if (!memcmp(a6, &v6_any, sizeof v6_any) || !memcmp(a6, &v6_loopback, sizeof v6_loopback))
            inet_pton(AF_INET, "127.0.0.1", &v4);
        else if (!v4_mapped(a6, &v4))
            return 0;  /* a real IPv6 address: untouched */
        port = ntohs(a->in6.sin6_port);
    } else {
        return 0;
    }

    struct in_addr new_addr = v4;
    uint16_t new_port = port;
    int self = is_v4(v4, "127.0.0.1") || is_v4(v4, "0.0.0.0") || v4.s_addr == own_addr.s_addr;
    if (self && kept[port])
        return 0;
    if (self) {
        new_addr = own_addr;
        if (port && port < 1024) {
            uint16_t to = is_bind ? relocate_privileged(port) : privileged_to[port] ? privileged_to[port]
                                                                                    : peer_port(own_addr, port);
            if (to)
                new_port = to;
        }
    } else if (!is_bind && port && port < 1024 && (ntohl(v4.s_addr) >> 24) == 127) {
        uint16_t to = peer_port(v4, port);
        if (to)
            new_port = to;
    }
    union sockaddr_any before = *a;
    if (v6) {
        set_v4_mapped(&a->in6.sin6_addr, new_addr);
        a->in6.sin6_port = htons(new_port);
    } else {
        a->in4.sin_addr = new_addr;
        a->in4.sin_port = htons(new_port);
    }
    return memcmp(&before, a, sizeof before) != 0;
}

/* ---- the record --------------------------------------------------------------------------- */

static char **recorded;
static size_t n_recorded, recorded_capacity;

/* "TCP", "UDPv6"...: the socket's protocol name, read through the tracee's fd (sockfs xattr). */
static void socket_proto(pid_t tid, long fd, char *out, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%ld", tid, fd);
    ssize_t n = getxattr(path, "system.sockprotoname", out, size - 1);
    out[n > 0 ? n : 0] = 0;
    if (n <= 0)
        snprintf(out, size, "?");
}

static void record(const char *kind, pid_t tid, long fd, const union sockaddr_any *from, const union sockaddr_any *to)
{
    if (record_fd < 0)
        return;
    char a[80], b[80], key[200];
    format_addr(from, a, sizeof a);
    format_addr(to, b, sizeof b);
    snprintf(key, sizeof key, "%s %s %s", kind, a, b);
    for (size_t i = 0; i < n_recorded; i++)
        if (!strcmp(recorded[i], key))
            return;
    if (n_recorded == recorded_capacity) {
        size_t capacity = recorded_capacity ? 2 * recorded_capacity : 32;
        char **grown = realloc(recorded, capacity * sizeof *recorded);
        if (!grown)
            return;
        recorded = grown;
        recorded_capacity = capacity;
    }
    if (!(recorded[n_recorded] = strdup(key)))
        return;
    n_recorded++;
    char proto[16], line[256];
    socket_proto(tid, fd, proto, sizeof proto);
    int len = snprintf(line, sizeof line, "%s %s %s %s\n", kind, proto, a, b);
    if (write(record_fd, line, (size_t)len) != len)
        fprintf(stderr, NAME ": cannot write the record: %s\n", strerror(errno));
}

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

/* the sockaddr argument and its length: bind/connect(fd, addr, len), sendto(fd, buf, n, flags, addr, len) */
static unsigned long long *addr_register(struct user_regs_struct *r, long nr)
{
    return nr == SYS_sendto ? &r->r8 : &r->rsi;
}

static unsigned long long addr_length(const struct user_regs_struct *r, long nr)
{
    return nr == SYS_sendto ? r->r9 : r->rdx;
}

/* ---- tracees ---------------------------------------------------------------------------------- */

struct tracee {
    pid_t tid;                    /* 0: free slot */
    enum phase phase;
    long nr, fd;
    unsigned long user_ptr;       /* the sockaddr the program passed */
    unsigned long copy_ptr;       /* where the rewritten one is (== user_ptr when written in place) */
    socklen_t len;
    union sockaddr_any original, rewritten;
    int parked;                   /* an IPv6-only bind moved to [::1]:0 */
    int retries;
};

static struct tracee *tracees;
static size_t tracee_slots, tracee_count;

static size_t slot_of(pid_t tid, size_t slots) { return ((size_t)tid * 2654435761u) % slots; }

static struct tracee *find_tracee(pid_t tid, int create)
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
static void forget_tracee(pid_t tid)
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

static void resume(pid_t tid, enum __ptrace_request how, int sig)
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

static void on_seccomp_stop(struct tracee *t)
{
    struct user_regs_struct regs;
    if (ptrace(PTRACE_GETREGS, t->tid, 0, &regs) < 0)
        return;
    int rewrite = 0;
    if (t->phase != RESTARTED) {
        t->nr = (long)regs.orig_rax;
        t->fd = (long)regs.rdi;
        t->user_ptr = *addr_register(&regs, t->nr);
        unsigned long long len = addr_length(&regs, t->nr);
        t->parked = 0;
        t->retries = 0;
        if (t->user_ptr && len >= sizeof(struct sockaddr_in) && len <= sizeof t->original) {
            t->len = (socklen_t)len;
            memset(&t->original, 0, sizeof t->original);
            if (read_memory(t->tid, t->user_ptr, &t->original, t->len) == 0) {
                int family_ok = t->original.sa.sa_family == AF_INET ||
                                (t->original.sa.sa_family == AF_INET6 && len >= 24);
                t->rewritten = t->original;
                rewrite = family_ok && relocate(&t->rewritten, t->nr == SYS_bind) && place_copy(t, &regs) == 0;
                if (rewrite) {
                    *addr_register(&regs, t->nr) = t->copy_ptr;
                    if (t->copy_ptr != t->user_ptr && ptrace(PTRACE_SETREGS, t->tid, 0, &regs) < 0)
                        rewrite = 0;
                }
            }
        }
    }
    t->phase = next_phase(t->phase, STOP_SECCOMP, rewrite, legacy_order);
    resume(t->tid, t->phase == IDLE ? PTRACE_CONT : PTRACE_SYSCALL, 0);
}

/* Restarts the call that just returned, with the tracee's rewritten sockaddr as it now is. */
static void restart_call(struct tracee *t, struct user_regs_struct *regs)
{
    write_memory(t->tid, t->copy_ptr, &t->rewritten, t->len, t->copy_ptr == t->user_ptr);
    regs->rip -= 2;  /* the `syscall` instruction */
    regs->rax = regs->orig_rax;
    ptrace(PTRACE_SETREGS, t->tid, 0, regs);
    t->phase = RESTARTED;
}

static void on_call_exit(struct tracee *t)
{
    struct user_regs_struct regs;
    if (ptrace(PTRACE_GETREGS, t->tid, 0, &regs) < 0)
        return;
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

    if (t->copy_ptr == t->user_ptr)
        write_memory(t->tid, t->user_ptr, &t->original, t->len, 1);
    else {
        *addr_register(&regs, t->nr) = t->user_ptr;
        ptrace(PTRACE_SETREGS, t->tid, 0, &regs);
    }
    if ((ret >= 0 || ret == -EINPROGRESS) && memcmp(&t->rewritten, &t->original, t->len) != 0)
        record(t->parked ? "park" : bind ? "bind" : t->nr == SYS_connect ? "connect" : "sendto", t->tid, t->fd,
               &t->original, &t->rewritten);
    t->phase = IDLE;
    resume(t->tid, PTRACE_CONT, 0);
}

/* ---- the traced command ---------------------------------------------------------------------- */

static int install_filter(void)
{
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),  /* i386 processes: not relocated */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_bind, 5, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_connect, 4, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sendto, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* sendto without an address (send() on a connected socket): no stop */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[4])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[4]) + 4),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),
    };
    struct sock_fprog prog = {sizeof code / sizeof code[0], code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

/* --check: the child binds a UDP socket to 127.0.0.1:0 under the filter and says whether it
 * landed on the own address. */
static int probe(void)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0) {
        fprintf(stderr, NAME ": the probe's bind failed: %s\n", strerror(errno));
        return 1;
    }
    if (getsockname(s, (struct sockaddr *)&a, &len) < 0 || a.sin_addr.s_addr != own_addr.s_addr) {
        fprintf(stderr, NAME ": the probe's bind was not relocated\n");
        return 1;
    }
    return 0;
}

static volatile pid_t forward_to;

/* A signal another process sent us goes to the command. The terminal's (SI_KERNEL) reached the
 * command's process group already. */
static void forward_signal(int sig, siginfo_t *info, void *context)
{
    (void)context;
    if (info->si_code != SI_KERNEL && forward_to > 0)
        kill(forward_to, sig);
}

static void install_forwarding(void)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = forward_signal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (int sig = 1; sig < NSIG; sig++) {
        switch (sig) {
        case SIGKILL: case SIGSTOP: case SIGCHLD:              /* cannot, or must not */
        case SIGTSTP: case SIGTTIN: case SIGTTOU:              /* job control stops us with the group */
        case SIGSEGV: case SIGBUS: case SIGILL: case SIGFPE: case SIGTRAP: case SIGSYS:  /* our own faults */
            continue;
        }
        if (sig > SIGSYS && sig < SIGRTMIN)  /* glibc's internal signals */
            continue;
        sigaction(sig, &action, NULL);
    }
}

/* Ends this process the way the command ended. */
static void pass_on(int status)
{
    if (WIFEXITED(status))
        exit(WEXITSTATUS(status));
    int sig = WTERMSIG(status);
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);  /* the command dumped its own core; ours would overwrite it */
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    exit(128 + sig);
}

static int kernel_before(int major, int minor)
{
    struct utsname u;
    int ma = 0, mi = 0;
    if (uname(&u) < 0 || sscanf(u.release, "%d.%d", &ma, &mi) != 2)
        return 0;
    return ma < major || (ma == major && mi < minor);
}

static void usage(void)
{
    fprintf(stderr, "usage: " NAME " --addr 127.A.B.C [--block LO-HI] [--map P:Q]... [--keep P]... [--record FILE]"
                    " [--peers DIR] -- COMMAND [ARG]...\n       " NAME " --check [--addr 127.A.B.C]\n");
    exit(EXIT_SETUP);
}

static int parse_port(const char *text, uint16_t *port)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || v < 1 || v > 65535)
        return 0;
    *port = (uint16_t)v;
    return *end == 0 || *end == ':' || *end == '-';
}

int main(int argc, char **argv)
{
    int check = 0, i;
    const char *addr_text = getenv("C2S_LOOPBACK_ADDR");
    for (i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(arg, "--")) {
            i++;
            break;
        } else if (!strcmp(arg, "--check")) {
            check = 1;
            continue;
        } else if (arg[0] != '-' || !value) {
            break;
        }
        i++;
        if (!strcmp(arg, "--addr")) {
            addr_text = value;
        } else if (!strcmp(arg, "--block")) {
            const char *dash = strchr(value, '-');
            if (!dash || !parse_port(value, &block_lo) || !parse_port(dash + 1, &block_hi) || block_hi < block_lo) {
                fprintf(stderr, NAME ": --block wants LO-HI, got %s\n", value);
                return EXIT_SETUP;
            }
            block_next = block_lo;
        } else if (!strcmp(arg, "--map")) {
            uint16_t from, to;
            const char *colon = strchr(value, ':');
            if (!colon || !parse_port(value, &from) || !parse_port(colon + 1, &to) || from >= 1024) {
                fprintf(stderr, NAME ": --map wants PRIVILEGED:PORT, got %s\n", value);
                return EXIT_SETUP;
            }
            privileged_to[from] = to;
        } else if (!strcmp(arg, "--keep")) {
            uint16_t port;
            if (!parse_port(value, &port)) {
                fprintf(stderr, NAME ": --keep wants a PORT, got %s\n", value);
                return EXIT_SETUP;
            }
            kept[port] = 1;
        } else if (!strcmp(arg, "--record")) {
            record_path = value;
        } else if (!strcmp(arg, "--peers")) {
            peers_dir = value;
        } else {
            usage();
        }
    }
    if (check && !addr_text)
        addr_text = "127.0.0.2";
    if (!addr_text || inet_pton(AF_INET, addr_text, &own_addr) != 1 || (ntohl(own_addr.s_addr) >> 24) != 127) {
        fprintf(stderr, NAME ": --addr (or C2S_LOOPBACK_ADDR) must be an address in 127.0.0.0/8\n");
        return EXIT_SETUP;
    }
    if (!check && i >= argc)
        usage();
    if (record_path && (record_fd = open(record_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)) < 0) {
        fprintf(stderr, NAME ": cannot open the record %s: %s\n", record_path, strerror(errno));
        return EXIT_SETUP;
    }
    legacy_order = kernel_before(4, 8);

    int go[2];
    if (pipe2(go, O_CLOEXEC) < 0) {
        fprintf(stderr, NAME ": pipe: %s\n", strerror(errno));
        return EXIT_SETUP;
    }
    install_forwarding();
    sigset_t all, before;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &before);  /* a signal between fork and forward_to is held, not lost */
    pid_t child = fork();
    if (child < 0) {
        fprintf(stderr, NAME ": fork: %s\n", strerror(errno));
        return EXIT_SETUP;
    }
    if (child == 0) {
        sigprocmask(SIG_SETMASK, &before, NULL);
        close(go[1]);
        char byte;
        if (read(go[0], &byte, 1) != 1)  /* the tracer could not attach: never run untraced */
            _exit(EXIT_SETUP);
        if (install_filter() < 0) {
            fprintf(stderr, NAME ": seccomp filters unavailable: %s\n", strerror(errno));
            _exit(EXIT_SETUP);
        }
        if (check)
            _exit(probe());
        execvp(argv[i], argv + i);
        int err = errno;
        fprintf(stderr, NAME ": %s: %s\n", argv[i], strerror(err));
        _exit(err == ENOENT ? 127 : 126);
    }
    forward_to = child;
    sigprocmask(SIG_SETMASK, &before, NULL);
    close(go[0]);
    long options = PTRACE_O_TRACESECCOMP | PTRACE_O_TRACECLONE | PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK |
                   PTRACE_O_TRACEEXEC | PTRACE_O_TRACESYSGOOD | PTRACE_O_EXITKILL;
    if (ptrace(PTRACE_SEIZE, child, 0, (void *)options) < 0) {
        int err = errno;
        char scope[8] = "";
        FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
        if (f) {
            if (fgets(scope, sizeof scope, f))
                scope[strcspn(scope, "\n")] = 0;
            fclose(f);
        }
        fprintf(stderr, NAME ": ptrace refused: %s%s%s\n", strerror(err),
                scope[0] ? ", kernel.yama.ptrace_scope=" : "", scope);
        close(go[1]);
        waitpid(child, NULL, 0);
        return check ? 1 : EXIT_SETUP;
    }
    if (write(go[1], "g", 1) != 1) {
        kill(child, SIGKILL);
        return EXIT_SETUP;
    }
    close(go[1]);

    for (;;) {
        int status;
        pid_t tid = waitpid(-1, &status, __WALL);
        if (tid < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, NAME ": waitpid: %s\n", strerror(errno));
            return EXIT_SETUP;
        }
        if (WIFEXITED(status) || WIFSIGNALED(status)) {
            forget_tracee(tid);
            if (tid != child)
                continue;
            if (check) {
                int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
                if (ok)
                    printf(NAME ": ok: bind/connect relocation by ptrace+seccomp (kernel stop order: %s)\n",
                           legacy_order ? "seccomp before syscall entry, < 4.8" : ">= 4.8");
                return ok ? 0 : 1;
            }
            pass_on(status);
        }
        if (!WIFSTOPPED(status))
            continue;
        int sig = WSTOPSIG(status), event = (unsigned)status >> 16;
        if (event == PTRACE_EVENT_EXEC) {
            unsigned long former = 0;  /* a thread that execs takes over the leader's id */
            if (ptrace(PTRACE_GETEVENTMSG, tid, 0, &former) == 0 && (pid_t)former != tid)
                forget_tracee((pid_t)former);
        }
        struct tracee *t = find_tracee(tid, 1);  /* valid until the next find/forget */
        switch (event) {
        case PTRACE_EVENT_SECCOMP:
            on_seccomp_stop(t);
            break;
        case PTRACE_EVENT_STOP:
            /* a group stop (SIGSTOP and friends): stay stopped until SIGCONT, still traced;
             * anything else (a new tracee's first stop, a SIGCONT wake-up): go on */
            if (sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU)
                resume(tid, PTRACE_LISTEN, 0);
            else
                resume(tid, PTRACE_CONT, 0);
            break;
        case PTRACE_EVENT_EXEC:
            t->phase = IDLE;
            resume(tid, PTRACE_CONT, 0);
            break;
        case PTRACE_EVENT_FORK: case PTRACE_EVENT_VFORK: case PTRACE_EVENT_CLONE:
            resume(tid, PTRACE_CONT, 0);
            break;
        default:
            if (sig == (SIGTRAP | 0x80)) {
                t->phase = next_phase(t->phase, STOP_SYSCALL, 0, legacy_order);
                if (t->phase == AT_EXIT)
                    on_call_exit(t);
                else
                    resume(tid, t->phase == IDLE ? PTRACE_CONT : PTRACE_SYSCALL, 0);
            } else {
                resume(tid, PTRACE_CONT, sig);  /* a signal for the tracee: deliver it */
            }
        }
    }
}

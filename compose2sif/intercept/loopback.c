/* c2s-loopback: run a command with a per-service virtual loopback.
 *
 *   c2s-loopback --addr 127.A.B.C [--block LO-HI] [--map P:Q]... [--dns ADDR:PORT] [--record FILE]
 *                [--peers DIR] [--reach ADDR,...] [--internal] [--private] [--share-ports] -- COMMAND [ARG]...
 *   c2s-loopback --host-network -- COMMAND [ARG]...   (a network_mode: host service beside own addresses)
 *   c2s-loopback --serve-dns ADDR:PORT --hosts FILE [--no-relay]   (the project's DNS server: loopback_dns.c)
 *   c2s-loopback --check [--addr 127.A.B.C]     (exit 0: works here; 1 and one line: why not)
 *   c2s-loopback --version
 *
 * For COMMAND and every process and thread it starts, bind/connect/sendto are relocated:
 *   - bind to 0.0.0.0, ::, 127.0.0.1, ::1 (or the service's own address) on port P goes to the
 *     service's own address on P (::ffff:127.A.B.C on AF_INET6 sockets); a privileged P (< 1024)
 *     goes to the port --map gives, else to the next port of --block;
 *   - connect/sendto to 127.0.0.1, ::1, ::ffff:127.0.0.1, 0.0.0.0 or :: go to the own address,
 *     a relocated privileged port to where it went; a privileged port of another 127.x address
 *     goes where that service's record (a file in --peers) says it went;
 *   - a bind to [::1] on port 0, and connects to what such a socket got, are left as written (the
 *     kernel picks a free port, and the socket stays an IPv6 one, as the program made it);
 *   - a TCP connect to one of the node's own addresses (not 127/8) on a port nothing listens on
 *     there (nor on every address), where the service listens on its own address, goes there
 *     (a program connecting to "its" address, as found in a container, finds itself);
 *   - a connect/sendto to 127.0.0.11:53 (Docker's DNS) goes to --dns, the project's DNS server;
 *   - with --reach, a connect/sendto to an address of the own address's /24 (the project's) that
 *     the list does not name fails with ECONNREFUSED; with --internal, one beyond that /24 fails
 *     with ENETUNREACH (the service's compose networks: compose2sif/plan/reach.py); the call is
 *     skipped, and the first refusal of each destination is said on stderr;
 *   - with --private, a TCP connection it accepts whose peer socket belongs to another user of
 *     the node (not this one, not root) is closed before the program sees it, and the accept
 *     waits for the next one; a UDP datagram such a socket sent is dropped before a receive
 *     returns it, and the receive waits for the next one (loopback_owner.c): those that name the
 *     sender, and read/readv/recv on a UDP socket bound to a port, whose fd number a second
 *     seccomp filter put into the process after its bind stops (loopback_ptrace.c);
 *   - sendmsg with an address in its msghdr goes as sendto does, and sendmmsg naming addresses
 *     too, one message per call; io_uring_setup fails with EPERM
 *     (a ring's calls would pass the filter), as Docker's default seccomp profile makes it;
 *   - with --share-ports (own-address binds) and --host-network (a host-network service's binds
 *     to 0.0.0.0 or [::], nothing else stopped), the bound socket gets SO_REUSEPORT, and a bind
 *     that found the port taken runs once more: a wildcard listener and own-address listeners of
 *     this user then share a port, each connection going to its exact address's listener first;
 *   - everything else is untouched.
 * Each distinct relocation is appended once to --record, one line: KIND PROTO FROM TO. A tracer
 * started beside the service's entry (a healthcheck, an exec) with the same --record finds the
 * privileged ports the entry relocated there.
 *
 * How: a seccomp filter (inherited by every descendant) returns SECCOMP_RET_TRACE for bind,
 * connect, sendto-with-an-address, sendmsg and sendmmsg only (with --private also accept and the
 * receives that name a sender); this process is their ptrace tracer (PTRACE_SEIZE, so
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
 *
 * This file: the options, the traced command's start and the trace loop; loopback.h lists the others.
 */
#include "loopback.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PTRACE_EVENT_STOP
#define PTRACE_EVENT_STOP 128
#endif

/* ---- the traced command ---------------------------------------------------------------------- */

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
    fprintf(stderr, "usage: " NAME " --addr 127.A.B.C [--block LO-HI] [--map P:Q]... [--dns ADDR:PORT] [--record FILE]"
                    " [--peers DIR] [--reach ADDR,...] [--internal] [--private] [--share-ports] -- COMMAND [ARG]...\n       "
                    NAME " --host-network -- COMMAND [ARG]...\n       " NAME " --check [--addr 127.A.B.C]\n       "
                    NAME " --serve-dns ADDR:PORT --hosts FILE [--no-relay]\n");
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

/* The options without a value: 1 where ARG is one, its flag set. */
static int switch_on(const char *arg, int *check)
{
    static const struct { const char *name; int *flag; } switches[] = {
        {"--internal", &internal_only}, {"--private", &private_only}, {"--no-relay", &dns_no_relay},
        {"--share-ports", &share_ports}, {"--host-network", &host_network}};
    if (!strcmp(arg, "--check"))
        return *check = 1;
    for (size_t k = 0; k < sizeof switches / sizeof switches[0]; k++)
        if (!strcmp(arg, switches[k].name))
            return *switches[k].flag = 1;
    return 0;
}

int main(int argc, char **argv)
{
    int check = 0, i;
    const char *addr_text = getenv("C2S_LOOPBACK_ADDR"), *serve_listen = NULL, *hosts_file = NULL;
    for (i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(arg, "--")) {
            i++;
            break;
        } else if (switch_on(arg, &check)) {
            continue;
        } else if (!strcmp(arg, "--version")) {
            printf(NAME " %s\n", C2S_VERSION);
            return 0;
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
        } else if (!strcmp(arg, "--dns")) {
            const char *colon = strrchr(value, ':');
            char host[INET_ADDRSTRLEN] = "";
            if (colon && (size_t)(colon - value) < sizeof host)
                memcpy(host, value, (size_t)(colon - value));
            if (!colon || inet_pton(AF_INET, host, &dns_addr) != 1 || !parse_port(colon + 1, &dns_port)) {
                fprintf(stderr, NAME ": --dns wants ADDR:PORT, got %s\n", value);
                return EXIT_SETUP;
            }
        } else if (!strcmp(arg, "--reach")) {
            /* ADDR,ADDR...: the project's addresses it may connect to (empty: none but its own) */
            char list[REACH_MAX * 16], *save = NULL;
            snprintf(list, sizeof list, "%s", value);
            reach_count = 0;
            for (char *item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
                if (reach_count == REACH_MAX || inet_pton(AF_INET, item, &reach_addrs[reach_count]) != 1) {
                    fprintf(stderr, NAME ": --reach wants up to %d IPv4 addresses, comma-separated, got %s\n",
                            REACH_MAX, value);
                    return EXIT_SETUP;
                }
                reach_count++;
            }
            continue;
        } else if (!strcmp(arg, "--serve-dns")) {
            serve_listen = value;
        } else if (!strcmp(arg, "--hosts")) {
            hosts_file = value;
        } else if (!strcmp(arg, "--record")) {
            record_path = value;
        } else if (!strcmp(arg, "--peers")) {
            peers_dir = value;
        } else {
            usage();
        }
    }
    if (serve_listen) {
        if (!hosts_file || i < argc)
            usage();
        return serve_dns(serve_listen, hosts_file);
    }
    if ((check || host_network) && !addr_text)
        addr_text = "127.0.0.2";  /* (--host-network relocates nothing: no own address) */
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
    read_node_addresses();
    read_ephemeral_range();

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
            forget_watches(tid);
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
                if (on_closing_stop(t) || on_sharing_stop(t) || on_watching_stop(t))
                    break;
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

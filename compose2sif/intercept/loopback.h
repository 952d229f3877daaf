/* What the files of c2s-loopback share. loopback.c says what the tracer does; the files:
 *   loopback.c         options, the traced command's start, signals passed on, the trace loop
 *   loopback_rules.c   where a sockaddr goes: own address, --map/--block/--keep, peers' records; the record
 *   loopback_ptrace.c  the seccomp filter, the tracees' memory and registers, what each stop does
 *   loopback_phase.h   where a tracee stands in a rewritten call (pure; tests/test_intercept.py drives it)
 * The package build (setup.py) compiles every loopback*.c into one static binary. Each .c includes this
 * header first. */
#ifndef C2S_LOOPBACK_H
#define C2S_LOOPBACK_H

#define _GNU_SOURCE
#include <netinet/in.h>
#include <stdint.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/user.h>

#include "loopback_phase.h"

#if !defined(__x86_64__)
#error "c2s-loopback: only x86_64 is implemented (aarch64 needs PTRACE_GETREGSET, x0 restore, 4-byte svc)"
#endif

#define NAME "c2s-loopback"
#ifndef C2S_VERSION
#define C2S_VERSION "unversioned"  /* the package build (setup.py) gives the version and source digest */
#endif
#define EXIT_SETUP 125

/* ---- configuration: set by main from the options (and the kernel's version) ------------------- */

extern struct in_addr own_addr;          /* the service's own address, 127.A.B.C */
extern uint16_t privileged_to[1024];     /* privileged port -> relocated port (0: not yet) */
extern int privileged_from_block[1024];  /* the relocation came from --block (may be retried) */
extern uint16_t block_lo, block_hi, block_next;
extern struct in_addr dns_addr;          /* --dns: where a query to Docker's DNS (127.0.0.11:53) goes */
extern uint16_t dns_port;                /* 0: no --dns */
extern int record_fd;                    /* --record, open for appending; -1: none */
extern const char *record_path;
extern const char *peers_dir;
extern int legacy_order;                 /* kernel < 4.8: seccomp stop before syscall-entry stop */
#define REACH_MAX 1024
extern struct in_addr reach_addrs[REACH_MAX];  /* --reach: the project's addresses it may connect to */
extern int reach_count;                  /* -1: no --reach (all of the project's) */
extern int internal_only;                /* --internal: nothing beyond the project's /24 */
extern int private_only;                 /* --private: accepted connections of other users closed, their
                                          * datagrams dropped */
extern int share_ports;                  /* --share-ports: its binds get SO_REUSEPORT, for a host-network
                                          * service's wildcard bind beside them (loopback_ptrace.c) */
extern int host_network;                 /* --host-network: no own address; only its wildcard binds are
                                          * stopped, to get SO_REUSEPORT */

/* ---- the rules (loopback_rules.c) ------------------------------------------------------------ */

union sockaddr_any {
    struct sockaddr sa;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    struct sockaddr_storage storage;
};

extern const struct in6_addr v6_loopback;

/* Rewrites *a in place for a bind (is_bind) or a connect/sendto of tracee TID on its socket FD;
 * returns 1 when it changed. */
int relocate(union sockaddr_any *a, int is_bind, pid_t tid, long fd);
/* 0 where a connect/sendto to *a (relocated) may go by --reach and --internal, else its errno. */
int refusal(const union sockaddr_any *a);
/* Whether A is ::ffff:a.b.c.d, and that IPv4 address. */
int v4_mapped_addr(const struct in6_addr *a, struct in_addr *out);
void refused_once(const union sockaddr_any *a, int err);
/* The node's own addresses (not 127/8), once at start, for connects to them (loopback_rules.c). */
void read_node_addresses(void);
/* Whether A is one of them. */
int node_address(struct in_addr a);
/* The kernel's ephemeral port range, once at start (loopback_rules.c: IPv6 loopback, port 0). */
void read_ephemeral_range(void);
/* The port privileged port P goes to, allocating from --block on first use; 0 when none is left. */
uint16_t relocate_privileged(uint16_t port);
/* Appends a relocation to --record, once: "KIND PROTO FROM TO". */
/* loopback_dns.c: --serve-dns, the project's DNS server */
int serve_dns(const char *listen, const char *hosts_file);
extern int dns_no_relay;

void record(const char *kind, pid_t tid, long fd, const union sockaddr_any *from, const union sockaddr_any *to);
/* "TCP", "UDPv6"...: the protocol of tracee TID's socket FD ("?" where it is none) */
void socket_proto(pid_t tid, long fd, char *out, size_t size);

/* loopback_owner.c: the process (thread group) of thread TID */
pid_t tgid_of(pid_t tid);
/* 1 where socket FD of tracee TID is a TCP connection another user's socket made */
int foreign_peer(pid_t tid, long fd);
/* 1 where tracee TID's UDP socket FD received its datagram from FROM, a socket of another user;
 * with DISCARD (it was only peeked at) that datagram is taken off the socket */
int foreign_sender(pid_t tid, long fd, const union sockaddr_any *from, int discard);
/* The same for sockets of this process (the project's DNS server); -1: sock_diag cannot tell */
int foreign_datagram(int fd, const union sockaddr_any *from);
int foreign_connection(int fd);
/* 1 where a UDP socket of the node would take a datagram to A:PORT, 0 none, -1 cannot tell */
int udp_taken_at(struct in_addr a, uint16_t port);

/* ---- the tracees (loopback_ptrace.c) --------------------------------------------------------- */

struct tracee {
    pid_t tid;                    /* 0: free slot */
    enum phase phase;
    long nr, fd;
    unsigned long user_ptr;       /* the sockaddr the program passed */
    unsigned long register_value; /* the argument register as it passed it (sendmsg: its msghdr) */
    struct msghdr msg;            /* sendmsg's msghdr, as it passed it */
    unsigned long copy_ptr;       /* where the rewritten one is (== user_ptr when written in place) */
    socklen_t len;
    union sockaddr_any original, rewritten;
    int parked;                   /* an IPv6-only bind moved to [::1]:0 */
    int retries;
    int closing;                  /* 1, 2: a close() of a foreign connection injected (entry, exit) */
    int sharing;                  /* 1, 2: a setsockopt(SO_REUSEPORT) injected after a bind (entry, exit) */
    int shared;                   /* 1: this bind's socket is to get SO_REUSEPORT at its exit; 2: it got it */
    socklen_t name_len;           /* a receive's address length and control length as the program passed */
    size_t control_len;           /* them, to run it again after a datagram of another user's */
    unsigned long long vlen;      /* a recvmmsg's or sendmmsg's count (0: not changed), put back at its exit */
    unsigned long header_copy;    /* sendmmsg: where the copy of its first mmsghdr is (0: none) */
    long unnamed;                 /* --private: a read, readv or recv of a watched UDP socket, run as a
                                   * receive that names the sender (its number; 0: none) */
    int watching;                 /* 1, 2: a seccomp() injected after a UDP bind (entry, exit) */
    int watch_bind;               /* this bind is a UDP socket's to a port: its fd to be watched */
    struct user_regs_struct saved;/* the accept's registers, to run it again after that close; the
                                   * bind's, to finish it after that setsockopt */
};

/* The seccomp filter that stops bind, connect and sendto-with-an-address (with --private also accept
 * and the receives that give a sender), for the child to install. */
int install_filter(void);
/* The tracee TID (a new one when CREATE), valid until the next find/forget. */
struct tracee *find_tracee(pid_t tid, int create);
void forget_tracee(pid_t tid);
void resume(pid_t tid, int how, int sig);
void on_seccomp_stop(struct tracee *t);
void on_call_exit(struct tracee *t);
/* A syscall stop of a tracee whose injected close() is under way: returns 0 where there is none. */
int on_closing_stop(struct tracee *t);
int on_sharing_stop(struct tracee *t);
int on_watching_stop(struct tracee *t);
/* A tracee's thread group is gone: what was known of its filters with it. */
void forget_watches(pid_t tid);

#endif

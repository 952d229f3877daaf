/* c2s-loopback's --private: who is at the other end of a connection a service accepted. On a
 * shared node every user reaches every loopback address; Docker's bridge lets nobody outside the
 * project's networks reach a port that is not published. So an accepted TCP connection whose
 * peer socket belongs to another user (not the tracer's user, not root) is closed before the
 * program reads a byte, and the accept runs again (loopback_ptrace.c). The accepted socket's two
 * ends come from a copy of its fd (pidfd_getfd), and the peer's socket, the one whose ends are
 * the same swapped, is looked up by them in the kernel (sock_diag), which gives its owner's uid.
 * On kernels before 5.6 (no pidfd_getfd) both come from the socket tables, /proc/net/tcp and
 * tcp6, readable by every user, read whole for each connection (slow where a node has many). A peer on another host (never on a loopback address) has no line there
 * and is let in, as is a connection whose peer is already gone. */
#include "loopback.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int private_only;

struct end { uint8_t addr[16]; unsigned port; };

/* An address of /proc/net/tcp (8 hex digits, a u32 as the kernel holds it) or tcp6 (32: four
 * such words), as 16 bytes of IPv6, IPv4 v4-mapped, so that both files' ends compare. */
static int parse_end(const char *hex, unsigned port, struct end *out)
{
    size_t n = strlen(hex);
    memset(out, 0, sizeof *out);
    out->port = port;
    if (n == 8) {
        uint32_t v = (uint32_t)strtoul(hex, NULL, 16);
        out->addr[10] = out->addr[11] = 0xff;
        memcpy(out->addr + 12, &v, 4);
        return 0;
    }
    if (n != 32)
        return -1;
    for (int i = 0; i < 4; i++) {
        char word[9];
        memcpy(word, hex + 8 * i, 8);
        word[8] = 0;
        uint32_t v = (uint32_t)strtoul(word, NULL, 16);
        memcpy(out->addr + 4 * i, &v, 4);
    }
    return 0;
}

/* Calls FOUND(local, remote, uid, inode, ctx) for each line of both tables until it returns 1. */
static int each_socket(pid_t tid, int (*found)(const struct end *, const struct end *, unsigned long,
                                                 unsigned long, void *), void *ctx)
{
    static const char *tables[] = {"tcp", "tcp6"};
    for (int i = 0; i < 2; i++) {
        char path[64], line[512], local[40], remote[40];
        unsigned lport, rport;
        unsigned long uid, inode;
        snprintf(path, sizeof path, "/proc/%d/net/%s", tid, tables[i]);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        while (fgets(line, sizeof line, f)) {
            struct end l, r;
            if (sscanf(line, " %*d: %39[0-9A-Fa-f]:%x %39[0-9A-Fa-f]:%x %*x %*s %*s %*s %lu %*d %lu", local, &lport,
                       remote, &rport, &uid, &inode) != 6 || parse_end(local, lport, &l) || parse_end(remote, rport, &r))
                continue;
            if (found(&l, &r, uid, inode, ctx)) {
                fclose(f);
                return 1;
            }
        }
        fclose(f);
    }
    return 0;
}

struct search { unsigned long inode; struct end local, remote; unsigned long uid; };

static int by_inode(const struct end *l, const struct end *r, unsigned long uid, unsigned long inode, void *ctx)
{
    struct search *s = ctx;
    (void)uid;
    if (inode != s->inode)
        return 0;
    s->local = *l;
    s->remote = *r;
    return 1;
}

static int by_ends(const struct end *l, const struct end *r, unsigned long uid, unsigned long inode, void *ctx)
{
    struct search *s = ctx;
    (void)inode;
    if (memcmp(l, &s->remote, sizeof *l) || memcmp(r, &s->local, sizeof *r))
        return 0;
    s->uid = uid;
    return 1;
}

/* ---- the quick way: the socket's ends through a copy of its fd (pidfd_getfd, Linux 5.6+), and
 * the peer socket's owner by an exact lookup of its four-tuple (sock_diag): no table read ---- */

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

static pid_t tgid_of(pid_t tid)
{
    char path[64], line[128];
    snprintf(path, sizeof path, "/proc/%d/status", tid);
    FILE *f = fopen(path, "re");
    pid_t tgid = tid;
    if (!f)
        return tid;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Tgid: %d", &tgid) == 1)
            break;
    fclose(f);
    return tgid;
}

/* The owner of the TCP socket whose local end is SRC and remote end DST (family FAMILY's
 * addresses, network order), as the kernel's inet_diag finds that one socket; -1: none found. */
static long diag_owner(int family, const void *src, uint16_t sport, const void *dst, uint16_t dport)
{
    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 req;
    } ask;
    memset(&ask, 0, sizeof ask);
    ask.nlh.nlmsg_len = sizeof ask;
    ask.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    ask.nlh.nlmsg_flags = NLM_F_REQUEST;
    ask.req.sdiag_family = (uint8_t)family;
    ask.req.sdiag_protocol = IPPROTO_TCP;
    ask.req.idiag_states = ~0U;
    ask.req.id.idiag_sport = sport;
    ask.req.id.idiag_dport = dport;
    memcpy(ask.req.id.idiag_src, src, family == AF_INET ? 4 : 16);
    memcpy(ask.req.id.idiag_dst, dst, family == AF_INET ? 4 : 16);
    ask.req.id.idiag_cookie[0] = ask.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    static int nl = -1;  /* one socket for the tracer's life: a question and its one answer at a time */
    if (nl < 0 && (nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG)) < 0)
        return -2;
    long uid = -1;
    char buf[8192];
    if (send(nl, &ask, sizeof ask, 0) == (ssize_t)sizeof ask) {
        ssize_t n = recv(nl, buf, sizeof buf, 0);
        struct nlmsghdr *h = (struct nlmsghdr *)buf;
        if (n >= (ssize_t)sizeof *h && NLMSG_OK(h, (size_t)n) && h->nlmsg_type == SOCK_DIAG_BY_FAMILY)
            uid = ((struct inet_diag_msg *)NLMSG_DATA(h))->idiag_uid;
    }
    return uid;
}

/* 1 foreign, 0 not, -1 this way cannot tell (an old kernel, no pidfd_getfd). */
static int foreign_by_diag(pid_t tid, long fd)
{
    int pidfd = (int)syscall(SYS_pidfd_open, tid, 0);  /* a process's main thread: its id is the process's */
    if (pidfd < 0)
        pidfd = (int)syscall(SYS_pidfd_open, tgid_of(tid), 0);
    if (pidfd < 0)
        return -1;
    int copy = (int)syscall(SYS_pidfd_getfd, pidfd, (int)fd, 0);
    close(pidfd);
    if (copy < 0)
        return -1;
    union sockaddr_any local, remote;
    socklen_t llen = sizeof local, rlen = sizeof remote;
    int got = getsockname(copy, &local.sa, &llen) == 0 && getpeername(copy, &remote.sa, &rlen) == 0;
    close(copy);
    if (!got)
        return 0;
    long uid = -1;
    if (local.sa.sa_family == AF_INET) {
        uid = diag_owner(AF_INET, &remote.in4.sin_addr, remote.in4.sin_port, &local.in4.sin_addr, local.in4.sin_port);
    } else if (local.sa.sa_family == AF_INET6) {
        struct in_addr l4, r4;
        /* a v4-mapped connection: the peer may be an IPv4 socket, or an IPv6 one v4-mapped too */
        if (v4_mapped_addr(&local.in6.sin6_addr, &l4) && v4_mapped_addr(&remote.in6.sin6_addr, &r4))
            uid = diag_owner(AF_INET, &r4, remote.in6.sin6_port, &l4, local.in6.sin6_port);
        if (uid == -1)
            uid = diag_owner(AF_INET6, &remote.in6.sin6_addr, remote.in6.sin6_port, &local.in6.sin6_addr,
                             local.in6.sin6_port);
    } else {
        return 0;
    }
    if (uid == -2)
        return -1;  /* no sock_diag here */
    return uid >= 0 && uid != (long)getuid() && uid != 0;
}

/* 1 where socket FD of tracee TID is a TCP connection whose peer belongs to another user. */
int foreign_peer(pid_t tid, long fd)
{
    int quick = foreign_by_diag(tid, fd);
    if (quick >= 0)
        return quick;
    /* the slow way: both ends and the peer's owner from the tables */

    char path[64], target[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%ld", tid, fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0)
        return 0;
    target[n] = 0;
    struct search s = {0};
    if (sscanf(target, "socket:[%lu]", &s.inode) != 1)
        return 0;
    if (!each_socket(tid, by_inode, &s) || !each_socket(tid, by_ends, &s))
        return 0;
    return s.uid != (unsigned long)getuid() && s.uid != 0;
}

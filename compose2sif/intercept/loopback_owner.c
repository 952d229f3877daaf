/* c2s-loopback's --private: who is at the other end of a connection a service accepted, and who
 * sent a datagram it received. On a shared node every user reaches every loopback address;
 * Docker's bridge lets nobody outside the project's networks reach a port that is not published.
 * So an accepted TCP connection whose peer socket belongs to another user (not the tracer's user,
 * not root) is closed before the program reads a byte, and the accept runs again; a UDP datagram
 * sent from such a socket is dropped, and the receive runs again (loopback_ptrace.c). The
 * service's socket comes from a copy of its fd (pidfd_getfd), and the sending or connecting
 * socket is looked up by its ends in the kernel (sock_diag), which gives its owner's uid.
 * On kernels before 5.6 (no pidfd_getfd) the owner comes from the socket tables instead,
 * /proc/net/tcp, udp and their IPv6 twins, readable by every user, read whole for each connection
 * or datagram (slow where a node has many sockets). A peer on another host (never on a loopback
 * address) has no line there and is let in, as is a connection whose peer is already gone. */
#include "loopback.h"

#include <arpa/inet.h>
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

/* Calls FOUND(local, remote, uid, inode, ctx) for each line of both tables of PROTO ("tcp" or
 * "udp") until it returns 1. */
static int each_socket(pid_t tid, const char *proto,
                       int (*found)(const struct end *, const struct end *, unsigned long, unsigned long, void *),
                       void *ctx)
{
    for (int i = 0; i < 2; i++) {
        char path[64], line[512], local[40], remote[40];
        unsigned lport, rport;
        unsigned long uid, inode;
        snprintf(path, sizeof path, "/proc/%d/net/%s%s", tid, proto, i ? "6" : "");
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

pid_t tgid_of(pid_t tid)
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

/* An owner, as the kernel's inet_diag finds one socket of PROTOCOL (IPPROTO_TCP or IPPROTO_UDP)
 * of family FAMILY by the ends SRC:SPORT and DST:DPORT (network order): for TCP the socket's
 * local end and its remote one; for UDP the other way round (the kernel looks a UDP socket up as
 * a datagram from SRC to DST would find it; "swapped for historical reasons", udp_diag.c).
 * -1: none found; -2: no sock_diag here. */
static long diag_owner(int protocol, int family, const void *src, uint16_t sport, const void *dst, uint16_t dport)
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
    ask.req.sdiag_protocol = (uint8_t)protocol;
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

/* The owner of the socket at the other end of a pair of ends: of the TCP connection whose local
 * end is LOCAL (then its peer's local end is REMOTE), or of the UDP socket bound to REMOTE that
 * sent a datagram to LOCAL. An IPv6 pair of v4-mapped ends may be an IPv4 socket or an IPv6 one. */
static long owner_at(int protocol, const union sockaddr_any *local, const union sockaddr_any *remote)
{
    const void *l, *r;
    uint16_t lport, rport;
    long uid = -1;
    struct in_addr l4, r4;
    if (local->sa.sa_family == AF_INET) {
        l = &local->in4.sin_addr, r = &remote->in4.sin_addr;
        lport = local->in4.sin_port, rport = remote->in4.sin_port;
    } else if (local->sa.sa_family == AF_INET6) {
        l = &local->in6.sin6_addr, r = &remote->in6.sin6_addr;
        lport = local->in6.sin6_port, rport = remote->in6.sin6_port;
        if (v4_mapped_addr(&local->in6.sin6_addr, &l4) && v4_mapped_addr(&remote->in6.sin6_addr, &r4))
            uid = protocol == IPPROTO_TCP ? diag_owner(protocol, AF_INET, &r4, rport, &l4, lport)
                                          : diag_owner(protocol, AF_INET, &l4, lport, &r4, rport);
        if (uid != -1)
            return uid;
    } else {
        return -1;
    }
    int family = local->sa.sa_family;
    return protocol == IPPROTO_TCP ? diag_owner(protocol, family, r, rport, l, lport)
                                   : diag_owner(protocol, family, l, lport, r, rport);
}

/* 1 where a UDP socket of the node would take a datagram sent to A:PORT (bound there, or to every
 * address on PORT), 0 where none would, -1 where sock_diag cannot tell: one lookup, no table read. */
int udp_taken_at(struct in_addr a, uint16_t port)
{
    struct in_addr from;
    inet_pton(AF_INET, "127.0.0.1", &from);
    long uid = diag_owner(IPPROTO_UDP, AF_INET, &from, 0, &a, htons(port));
    return uid == -2 ? -1 : uid >= 0;
}

/* Another user's: not the tracer's user, not root (-1: no owner found). */
static int foreign_uid(long uid)
{
    return uid >= 0 && uid != (long)getuid() && uid != 0;
}

/* A copy of tracee TID's fd FD in this process (pidfd_getfd, Linux 5.6+); -1 where that fails. */
static int copy_fd(pid_t tid, long fd)
{
    int pidfd = (int)syscall(SYS_pidfd_open, tid, 0);  /* a process's main thread: its id is the process's */
    if (pidfd < 0)
        pidfd = (int)syscall(SYS_pidfd_open, tgid_of(tid), 0);
    if (pidfd < 0)
        return -1;
    int copy = (int)syscall(SYS_pidfd_getfd, pidfd, (int)fd, 0);
    close(pidfd);
    return copy;
}

/* 1 where this process's TCP socket FD is a connection whose peer socket is another user's; -1
 * where sock_diag cannot tell. */
int foreign_connection(int fd)
{
    union sockaddr_any local, remote;
    socklen_t llen = sizeof local, rlen = sizeof remote;
    if (getsockname(fd, &local.sa, &llen) != 0 || getpeername(fd, &remote.sa, &rlen) != 0)
        return 0;
    long uid = owner_at(IPPROTO_TCP, &local, &remote);
    if (uid == -2)
        return -1;  /* no sock_diag here */
    return foreign_uid(uid);
}

/* 1 foreign, 0 not, -1 this way cannot tell (an old kernel, no pidfd_getfd). */
static int foreign_by_diag(pid_t tid, long fd)
{
    int copy = copy_fd(tid, fd);
    if (copy < 0)
        return -1;
    int foreign = foreign_connection(copy);
    close(copy);
    return foreign;
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
    if (!each_socket(tid, "tcp", by_inode, &s) || !each_socket(tid, "tcp", by_ends, &s))
        return 0;
    return foreign_uid((long)s.uid);
}

/* ---- datagrams ------------------------------------------------------------------------------- */

/* The first port an unprivileged user may bind (net.ipv4.ip_unprivileged_port_start, 1024 where
 * the kernel has no such setting). */
static unsigned unprivileged_port_start(void)
{
    static unsigned start;
    if (!start) {
        FILE *f = fopen("/proc/sys/net/ipv4/ip_unprivileged_port_start", "re");
        if (!f || fscanf(f, "%u", &start) != 1)
            start = 1024;
        if (f)
            fclose(f);
        if (!start)
            start = 65536;  /* 0: every port is anyone's */
    }
    return start;
}

/* Whether A is an address of this node: 127/8, ::1, or one of the node's own (IPv4, v4-mapped
 * too), on a port any user may bind. Only a datagram from such an address can come from a socket
 * of another user of the node; one from another host is let in without a lookup, and so is one
 * from a privileged port, which only root and the services it starts bind: the node's resolver
 * (systemd-resolved's 127.0.0.53:53, a dnsmasq) answers under a user of its own. */
static int from_this_node(const union sockaddr_any *a)
{
    struct in_addr v4;
    if (ntohs(a->sa.sa_family == AF_INET ? a->in4.sin_port : a->in6.sin6_port) < unprivileged_port_start())
        return 0;
    if (a->sa.sa_family == AF_INET)
        v4 = a->in4.sin_addr;
    else if (a->sa.sa_family != AF_INET6)
        return 0;
    else if (!memcmp(&a->in6.sin6_addr, &v6_loopback, sizeof v6_loopback))
        return 1;
    else if (!v4_mapped_addr(&a->in6.sin6_addr, &v4))
        return 0;
    return (ntohl(v4.s_addr) >> 24) == 127 || node_address(v4);
}

/* An end as /proc/net/udp[6] writes it: 16 bytes of IPv6, IPv4 v4-mapped. */
static void end_of(const union sockaddr_any *a, struct end *out)
{
    memset(out, 0, sizeof *out);
    if (a->sa.sa_family == AF_INET) {
        out->addr[10] = out->addr[11] = 0xff;
        memcpy(out->addr + 12, &a->in4.sin_addr, 4);
        out->port = ntohs(a->in4.sin_port);
    } else {
        memcpy(out->addr, &a->in6.sin6_addr, 16);
        out->port = ntohs(a->in6.sin6_port);
    }
}

static int by_local(const struct end *l, const struct end *r, unsigned long uid, unsigned long inode, void *ctx)
{
    struct search *s = ctx;
    (void)r, (void)inode;
    if (memcmp(l, &s->local, sizeof *l))
        return 0;
    s->uid = uid;
    return 1;
}

/* A socket bound to every address (0.0.0.0 or [::]) on the port of s->local: a sender too. */
static int by_wildcard_port(const struct end *l, const struct end *r, unsigned long uid, unsigned long inode,
                            void *ctx)
{
    static const uint8_t any4[16] = {[10] = 0xff, [11] = 0xff}, any6[16] = {0};
    struct search *s = ctx;
    if (l->port != s->local.port || (memcmp(l->addr, any4, 16) && memcmp(l->addr, any6, 16)))
        return 0;
    return by_local(&s->local, r, uid, inode, ctx);
}

/* The owner of the UDP socket of the node at FROM, by the tables: the slow way. */
static long owner_by_table(pid_t tid, const union sockaddr_any *from)
{
    struct search s = {0};
    end_of(from, &s.local);
    return each_socket(tid, "udp", by_local, &s) || each_socket(tid, "udp", by_wildcard_port, &s) ? (long)s.uid : -1;
}

/* 1 where the datagram that socket FD (this process's) received from FROM was sent by a socket of
 * another user of the node; -1 where sock_diag cannot tell. */
int foreign_datagram(int fd, const union sockaddr_any *from)
{
    if (!from_this_node(from))
        return 0;
    int protocol = 0;
    socklen_t plen = sizeof protocol;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &plen) < 0 || protocol != IPPROTO_UDP)
        return 0;
    union sockaddr_any local;
    socklen_t llen = sizeof local;
    if (getsockname(fd, &local.sa, &llen) < 0 || local.sa.sa_family != from->sa.sa_family)
        return 0;
    /* a socket bound to every address: the datagram was sent to the service's own address (a
     * connected sender's socket is looked up by where it is connected to) */
    if (local.sa.sa_family == AF_INET && local.in4.sin_addr.s_addr == htonl(INADDR_ANY))
        local.in4.sin_addr = own_addr;
    long uid = owner_at(IPPROTO_UDP, &local, from);
    if (uid == -2)
        return -1;
    return foreign_uid(uid);
}

/* 1 where tracee TID's socket FD received a datagram from FROM that a socket of another user of
 * the node sent. With DISCARD (the program only peeked at it) that datagram is taken off the
 * socket through the tracer's copy of it; where there is no copy (before Linux 5.6) it cannot be,
 * and it is let in rather than peeked at for ever. */
int foreign_sender(pid_t tid, long fd, const union sockaddr_any *from, int discard)
{
    if (!from_this_node(from))
        return 0;
    int copy = copy_fd(tid, fd);
    if (copy >= 0) {
        int quick = foreign_datagram(copy, from);
        if (quick == 1 && discard) {
            char byte;
            quick = recv(copy, &byte, sizeof byte, MSG_DONTWAIT) >= 0;
        }
        close(copy);
        if (quick >= 0)
            return quick;
    }
    return !discard && foreign_uid(owner_by_table(tid, from));
}

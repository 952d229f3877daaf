/* c2s-loopback's rules: where a bind, connect or sendto address goes (the service's own address,
 * a privileged port's relocation by --map or --block, Docker's DNS by --dns, the relocations other tracers
 * recorded), and the record of the relocations made. No ptrace here: loopback_ptrace.c reads the
 * sockaddr out of the tracee and writes the rewritten one back. */
#include "loopback.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

/* ---- configuration (loopback.h) ------------------------------------------------------------ */

struct in_addr own_addr;
uint16_t privileged_to[1024];
int privileged_from_block[1024];
uint16_t block_lo, block_hi, block_next;
struct in_addr dns_addr;
uint16_t dns_port;
int record_fd = -1;
const char *record_path;
const char *peers_dir;

/* ---- addresses ------------------------------------------------------------------------------ */

static const struct in6_addr v6_any = IN6ADDR_ANY_INIT;
const struct in6_addr v6_loopback = IN6ADDR_LOOPBACK_INIT;

static int v4_mapped(const struct in6_addr *a, struct in_addr *out)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(a->s6_addr, prefix, 12) != 0)
        return 0;
    memcpy(&out->s_addr, a->s6_addr + 12, 4);
    return 1;
}

int v4_mapped_addr(const struct in6_addr *a, struct in_addr *out) { return v4_mapped(a, out); }

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

static uint16_t peer_port(struct in_addr addr, uint16_t port);

uint16_t relocate_privileged(uint16_t port)
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

/* "TCP", "UDPv6"...: the socket's protocol name, read through the tracee's fd (sockfs xattr). */
void socket_proto(pid_t tid, long fd, char *out, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%ld", tid, fd);
    ssize_t n = getxattr(path, "system.sockprotoname", out, size - 1);
    out[n > 0 ? n : 0] = 0;
    if (n <= 0)
        snprintf(out, size, "?");
}

/* ---- the node's own addresses ---------------------------------------------------------------- */

/* Programs find "their" address the way they would in a container (a UDP connect towards the
 * outside, the hostname), then connect to it: here that is the node's address, where nothing of
 * the service listens any more. So a TCP connect to one of the node's own addresses (not 127/8)
 * on a port nothing listens on there (nor on every address) goes to the service's own address
 * where it listens on that port. The kernel's listener tables say which; only such connects
 * (rare: a rendezvous, a self-check) read them. */
#define MAX_NODE_ADDRS 64
static struct in_addr node_addrs[MAX_NODE_ADDRS];
static size_t n_node_addrs;

void read_node_addresses(void)
{
    struct ifaddrs *list, *i;
    if (getifaddrs(&list) < 0)
        return;
    for (i = list; i && n_node_addrs < MAX_NODE_ADDRS; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
            struct in_addr a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
            if ((ntohl(a.s_addr) >> 24) != 127)
                node_addrs[n_node_addrs++] = a;
        }
    freeifaddrs(list);
}

int node_address(struct in_addr a)
{
    for (size_t i = 0; i < n_node_addrs; i++)
        if (node_addrs[i].s_addr == a.s_addr)
            return 1;
    return 0;
}

/* Whether a socket of the node is bound to A6 (or, with OR_ANY, to every address) port PORT: a
 * TCP listener, or any UDP socket, by /proc/net/{tcp,udp}[6] (an IPv4 address as v4-mapped). */
static int bound_at(int udp, const struct in6_addr *a6, uint16_t port, int or_any)
{
    const char *tables[2] = {udp ? "/proc/net/udp" : "/proc/net/tcp", udp ? "/proc/net/udp6" : "/proc/net/tcp6"};
    uint32_t want[4];
    memcpy(want, a6, sizeof want);
    char line[512];
    int found = 0;
    for (int t = 0; t < 2 && !found; t++) {
        FILE *f = fopen(tables[t], "re");
        if (!f)
            continue;
        while (!found && fgets(line, sizeof line, f)) {
            unsigned w[4], p, state;
            if (t == 0) {
                if (sscanf(line, " %*u: %8X:%4X %*8X:%*4X %2X", &w[3], &p, &state) != 3)
                    continue;
                w[0] = w[1] = 0, w[2] = htonl(0xffff);
            } else if (sscanf(line, " %*u: %8X%8X%8X%8X:%4X %*32X:%*4X %2X", &w[0], &w[1], &w[2], &w[3], &p,
                              &state) != 6) {
                continue;
            }
            if (p != port || (!udp && state != 0x0A))  /* TCP: listeners only */
                continue;
            int any = !w[0] && !w[1] && !w[3] && (!w[2] || w[2] == htonl(0xffff));
            found = (w[0] == want[0] && w[1] == want[1] && w[2] == want[2] && w[3] == want[3]) || (or_any && any);
        }
        fclose(f);
    }
    return found;
}

static int is_udp(pid_t tid, long fd)
{
    char proto[16];
    socket_proto(tid, fd, proto, sizeof proto);
    return !strncmp(proto, "UDP", 3);
}

static struct in6_addr mapped(struct in_addr a)
{
    struct in6_addr a6;
    set_v4_mapped(&a6, a);
    return a6;
}

/* A connect to a node's address on PORT that only the service itself can answer: 1. */
static int own_behind_node_address(pid_t tid, long fd, struct in_addr a, uint16_t port)
{
    if (!port || !node_address(a))
        return 0;
    char proto[16];
    socket_proto(tid, fd, proto, sizeof proto);
    struct in6_addr there = mapped(a), own = mapped(own_addr);
    if (strncmp(proto, "TCP", 3) != 0 || bound_at(0, &there, port, 1))
        return 0;
    if (port < 1024)
        return privileged_to[port] || peer_port(own_addr, port);
    return bound_at(0, &own, port, 0);
}

/* ---- IPv6 loopback, port 0 ---------------------------------------------------------------------
 * A bind to [::1] on port 0 (the kernel picks a free port: it cannot clash) stays as written: a
 * v4-mapped own address in its place would turn the program's IPv6 loopback socket into an IPv4
 * one, which programs that check (squid's helper sockets) refuse to connect. A connect to [::1] on
 * a port of the kernel's ephemeral range where such a socket is bound, and nothing at the
 * service's own address, stays as written too (the kernel's socket tables say so; only connects
 * to [::1] on that range read them). */
static unsigned ephemeral_lo = 32768, ephemeral_hi = 60999;

void read_ephemeral_range(void)
{
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
    if (!f)
        return;
    unsigned lo, hi;
    if (fscanf(f, "%u %u", &lo, &hi) == 2 && lo <= hi)
        ephemeral_lo = lo, ephemeral_hi = hi;
    fclose(f);
}

static int bound_on_v6_loopback_only(pid_t tid, long fd, uint16_t port)
{
    if (port < ephemeral_lo || port > ephemeral_hi)
        return 0;
    int udp = is_udp(tid, fd);
    struct in6_addr own = mapped(own_addr);
    return bound_at(udp, &v6_loopback, port, 0) && !bound_at(udp, &own, port, 0);
}

/* A datagram to 127.0.0.1 on a port of the kernel's ephemeral range where nothing of the service
 * is (no UDP socket would take it at the own address): a reply to a client elsewhere on the node,
 * whose datagrams came from 127.0.0.1 (the kernel's source towards every 127.x address, and a
 * connected client socket is bound there). It goes as written, not to the service itself. One
 * sock_diag lookup per such send (where there is none, the socket tables). */
static int reply_to_a_client_of_the_node(pid_t tid, long fd, uint16_t port)
{
    if (port < ephemeral_lo || port > ephemeral_hi || !is_udp(tid, fd))
        return 0;
    int own = udp_taken_at(own_addr, port);
    if (own >= 0)
        return !own;
    struct in_addr lo;
    inet_pton(AF_INET, "127.0.0.1", &lo);
    struct in6_addr at = mapped(lo), own6 = mapped(own_addr);
    return bound_at(1, &at, port, 1) && !bound_at(1, &own6, port, 0);
}

/* ---- the decision ---------------------------------------------------------------------------- */

int relocate(union sockaddr_any *a, int is_bind, pid_t tid, long fd)
{
    struct in_addr v4;
    uint16_t port;
    int ipv6_own = 0;  /* [::] or [::1]: the own address as 127.0.0.1 is, with rules of its own above */
    int v6 = a->sa.sa_family == AF_INET6;
    if (a->sa.sa_family == AF_INET) {
        v4 = a->in4.sin_addr;
        port = ntohs(a->in4.sin_port);
    } else if (v6) {
        const struct in6_addr *a6 = &a->in6.sin6_addr;
        int loopback6 = !memcmp(a6, &v6_loopback, sizeof v6_loopback);
        if (loopback6 && (is_bind ? !a->in6.sin6_port : bound_on_v6_loopback_only(tid, fd, ntohs(a->in6.sin6_port))))
            return 0;  /* see "IPv6 loopback, port 0" */
        if (!memcmp(a6, &v6_any, sizeof v6_any) || loopback6)
            inet_pton(AF_INET, "127.0.0.1", &v4), ipv6_own = 1;
        else if (!v4_mapped(a6, &v4))
            return 0;  /* a real IPv6 address: untouched */
        port = ntohs(a->in6.sin6_port);
    } else {
        return 0;
    }

    if (!is_bind && !ipv6_own && is_v4(v4, "127.0.0.1") && reply_to_a_client_of_the_node(tid, fd, port))
        return 0;
    struct in_addr new_addr = v4;
    uint16_t new_port = port;
    int self = is_v4(v4, "127.0.0.1") || is_v4(v4, "0.0.0.0") || v4.s_addr == own_addr.s_addr ||
               (!is_bind && own_behind_node_address(tid, fd, v4, port));
    if (!is_bind && dns_port && port == 53 && is_v4(v4, "127.0.0.11")) {  /* Docker's DNS: the project's */
        new_addr = dns_addr;
        new_port = dns_port;
    } else if (self) {
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

/* ---- reach: the networks of the service (--reach, --internal) ------------------------------- */

struct in_addr reach_addrs[REACH_MAX];
int reach_count = -1;
int internal_only;

/* Whether a connect or sendto to A (as relocate left it) may go: 0, or the error it fails with.
 * An address of the project's /24 (the own address's) other than the own one goes only where
 * --reach lists it (with no --reach, everywhere); beyond the /24, and its gateway .1 (the node, as
 * host.docker.internal), nowhere under --internal. The
 * project's DNS server (--dns) is reached by every service, as Docker's is from every network.
 * [::1] on a port of the kernel's choosing ("IPv6 loopback, port 0") is the service's own. */
int refusal(const union sockaddr_any *a)
{
    struct in_addr v4;
    uint16_t port;
    if (reach_count < 0 && !internal_only)
        return 0;
    if (a->sa.sa_family == AF_INET) {
        v4 = a->in4.sin_addr;
        port = ntohs(a->in4.sin_port);
    } else if (a->sa.sa_family == AF_INET6) {
        if (!memcmp(&a->in6.sin6_addr, &v6_loopback, sizeof v6_loopback))
            return 0;
        if (!v4_mapped(&a->in6.sin6_addr, &v4))
            return internal_only ? ENETUNREACH : 0;
        port = ntohs(a->in6.sin6_port);
    } else {
        return 0;
    }
    if (v4.s_addr == own_addr.s_addr || (dns_port && v4.s_addr == dns_addr.s_addr && port == dns_port))
        return 0;
    if ((ntohl(v4.s_addr) >> 8) != (ntohl(own_addr.s_addr) >> 8))
        return internal_only ? ENETUNREACH : 0;
    for (int i = 0; i < reach_count; i++)
        if (reach_addrs[i].s_addr == v4.s_addr)
            return 0;
    if ((ntohl(v4.s_addr) & 0xff) == 1)  /* the project's gateway, 127.A.B.1: the node, as Docker's is */
        return internal_only ? ENETUNREACH : 0;
    return reach_count < 0 ? 0 : ECONNREFUSED;
}

/* One line on the service's stderr the first time each destination is refused (a program that
 * retries must not fill its log). */
void refused_once(const union sockaddr_any *a, int err)
{
    static char seen[64][80];
    static int n_seen;
    char where[80];
    format_addr(a, where, sizeof where);
    for (int i = 0; i < n_seen; i++)
        if (!strcmp(seen[i], where))
            return;
    if (n_seen < 64)
        snprintf(seen[n_seen++], sizeof seen[0], "%s", where);
    fprintf(stderr, NAME ": a connection to %s was refused: %s\n", where,
            err == ENETUNREACH ? "beyond the project, and every network of this service is internal"
                               : "that service shares no network with this one");
}

/* ---- the record --------------------------------------------------------------------------- */

static char **recorded;
static size_t n_recorded, recorded_capacity;

void record(const char *kind, pid_t tid, long fd, const union sockaddr_any *from, const union sockaddr_any *to)
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

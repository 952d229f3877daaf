/* c2s-loopback --serve-dns ADDR:PORT --hosts FILE: Docker's embedded DNS (127.0.0.11) for one
 * project, on the node. Each service's tracer sends the queries its programs make to
 * 127.0.0.11:53 here (--dns). A name of the hosts file (lines "ADDRESS NAME...": the project's
 * service names, aliases, hostnames and container names) is answered with its addresses (A; a
 * known name asked for another type gets no record, as from Docker's DNS for a container without
 * IPv6); any other query goes to the node's resolver (the first nameserver of /etc/resolv.conf),
 * over UDP or TCP as it came, and its answer back (with --no-relay, for services whose networks are
 * all internal: a failure). The hosts file is read again when it changes.
 * One process; a child for each relayed query and each TCP connection. Exit codes: 125 when it
 * cannot listen (one line on stderr). */
#include "loopback.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_HOSTS 4096
#define TTL 600            /* seconds, as Docker's DNS answers */
#define RELAY_TIMEOUT_MS 5000

static struct host {
    char name[256];
    struct in_addr addr;
} hosts[MAX_HOSTS];
static size_t n_hosts;
static const char *hosts_path;
static struct stat hosts_seen;
static struct sockaddr_storage upstream;
static socklen_t upstream_len;

static void load_hosts(void)
{
    struct stat st;
    if (stat(hosts_path, &st) < 0)
        return;
    if (st.st_mtim.tv_sec == hosts_seen.st_mtim.tv_sec && st.st_mtim.tv_nsec == hosts_seen.st_mtim.tv_nsec &&
        st.st_size == hosts_seen.st_size && st.st_ino == hosts_seen.st_ino)
        return;
    FILE *f = fopen(hosts_path, "re");
    if (!f)
        return;
    hosts_seen = st;
    n_hosts = 0;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        char *save = NULL, *word = strtok_r(line, " \t\r\n", &save);
        struct in_addr addr;
        if (!word || word[0] == '#' || inet_pton(AF_INET, word, &addr) != 1)
            continue;
        while ((word = strtok_r(NULL, " \t\r\n", &save)) && word[0] != '#' && n_hosts < MAX_HOSTS) {
            if (strlen(word) >= sizeof hosts[0].name)
                continue;
            strcpy(hosts[n_hosts].name, word);
            hosts[n_hosts++].addr = addr;
        }
    }
    fclose(f);
}

/* The node's resolver: the first nameserver of /etc/resolv.conf that is not Docker's address. */
static void find_upstream(void)
{
    FILE *f = fopen("/etc/resolv.conf", "re");
    char line[512], server[256];
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, " nameserver %255s", server) != 1 || !strcmp(server, "127.0.0.11"))
            continue;
        struct sockaddr_in *v4 = (struct sockaddr_in *)&upstream;
        struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&upstream;
        if (inet_pton(AF_INET, server, &v4->sin_addr) == 1) {
            v4->sin_family = AF_INET, v4->sin_port = htons(53), upstream_len = sizeof *v4;
            break;
        }
        if (inet_pton(AF_INET6, server, &v6->sin6_addr) == 1) {
            v6->sin6_family = AF_INET6, v6->sin6_port = htons(53), upstream_len = sizeof *v6;
            break;
        }
    }
    if (f)
        fclose(f);
}

/* The question of query Q: its name (lower case, no final dot) and type; the offset where the
 * question ends, or -1 where the query is not one plain question. */
static int question(const unsigned char *q, size_t len, char *name, size_t size, unsigned *type)
{
    if (len < 12 || (q[2] & 0x80) || q[4] != 0 || q[5] != 1)
        return -1;
    size_t at = 12, out = 0;
    for (;;) {
        if (at >= len)
            return -1;
        unsigned n = q[at++];
        if (n == 0)
            break;
        if (n > 63 || at + n > len || out + n + 2 > size)
            return -1;
        if (out)
            name[out++] = '.';
        for (unsigned k = 0; k < n; k++)
            name[out++] = (char)tolower(q[at + k]);
        at += n;
    }
    name[out] = 0;
    if (at + 4 > len)
        return -1;
    *type = (unsigned)q[at] << 8 | q[at + 1];
    return (int)(at + 4);
}

/* The answer to query Q (LEN bytes) from the hosts file, in R (SIZE bytes); its length, or 0 where
 * the name is not the project's (the node's resolver answers it). */
static size_t local_answer(const unsigned char *q, size_t len, unsigned char *r, size_t size)
{
    char name[256];
    unsigned type;
    int end = question(q, len, name, sizeof name, &type);
    if (end < 0 || (size_t)end > size)
        return 0;
    load_hosts();
    size_t found = 0, at = (size_t)end;
    memcpy(r, q, (size_t)end);
    for (size_t i = 0; i < n_hosts; i++) {
        if (strcasecmp(hosts[i].name, name))
            continue;
        found++;
        if (type != 1 && type != 255)  /* A, or ANY */
            continue;
        if (at + 16 > size)
            break;
        static const unsigned char head[] = {0xc0, 0x0c, 0, 1, 0, 1, TTL >> 24, (TTL >> 16) & 0xff,
                                             (TTL >> 8) & 0xff, TTL & 0xff, 0, 4};
        memcpy(r + at, head, sizeof head);
        memcpy(r + at + sizeof head, &hosts[i].addr, 4);
        at += 16;
    }
    if (!found)
        return 0;
    unsigned answers = (unsigned)(at - (size_t)end) / 16;
    r[2] = (unsigned char)(0x84 | (q[2] & 0x79));  /* a response, authoritative; opcode and RD as asked */
    r[3] = 0x80;                                    /* recursion available, no error */
    r[6] = (unsigned char)(answers >> 8), r[7] = (unsigned char)answers;
    r[8] = r[9] = r[10] = r[11] = 0;
    return at;
}

/* A reply of the server-failure kind to query Q, in R: where no resolver can answer. */
static size_t failure(const unsigned char *q, size_t len, unsigned char *r)
{
    char name[256];
    unsigned type;
    int end = question(q, len, name, sizeof name, &type);
    if (end < 0)
        end = len < 12 ? 0 : 12;
    memcpy(r, q, (size_t)end);
    if (end >= 12) {
        r[2] = (unsigned char)(0x80 | (q[2] & 0x79));
        r[3] = 0x82;
        r[6] = r[7] = r[8] = r[9] = r[10] = r[11] = 0;
    }
    return (size_t)end;
}

static int wait_for(int fd, short events)
{
    struct pollfd p = {fd, events, 0};
    return poll(&p, 1, RELAY_TIMEOUT_MS) == 1 && !(p.revents & (POLLERR | POLLNVAL));
}

static int full(int fd, void *buffer, size_t len, int writing)
{
    for (size_t done = 0; done < len;) {
        if (!wait_for(fd, writing ? POLLOUT : POLLIN))
            return -1;
        ssize_t n = writing ? write(fd, (char *)buffer + done, len - done) : read(fd, (char *)buffer + done, len - done);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}

/* The node's resolver's answer to Q, in R (SIZE bytes), over UDP or TCP; its length, 0 on failure. */
static size_t relay(const unsigned char *q, size_t len, unsigned char *r, size_t size, int tcp)
{
    if (!upstream_len)
        return 0;
    int s = socket(upstream.ss_family, (tcp ? SOCK_STREAM : SOCK_DGRAM) | SOCK_CLOEXEC, 0);
    size_t got = 0;
    if (s < 0 || connect(s, (struct sockaddr *)&upstream, upstream_len) < 0)
        goto done;
    if (tcp) {
        unsigned char prefix[2] = {(unsigned char)(len >> 8), (unsigned char)len};
        if (full(s, prefix, 2, 1) < 0 || full(s, (void *)q, len, 1) < 0 || full(s, prefix, 2, 0) < 0)
            goto done;
        size_t n = (size_t)prefix[0] << 8 | prefix[1];
        if (n <= size && full(s, r, n, 0) == 0)
            got = n;
    } else if (send(s, q, len, 0) == (ssize_t)len && wait_for(s, POLLIN)) {
        ssize_t n = recv(s, r, size, 0);
        got = n > 0 ? (size_t)n : 0;
    }
done:
    if (s >= 0)
        close(s);
    return got;
}

static size_t respond(const unsigned char *q, size_t len, unsigned char *r, size_t size, int tcp)
{
    size_t n = local_answer(q, len, r, size);
    if (!n)
        n = relay(q, len, r, size, tcp);
    return n ? n : failure(q, len, r);
}

/* One TCP connection: queries, each with its two-byte length, until the client closes. */
static void serve_tcp(int c)
{
    static unsigned char q[65535], r[65535];
    unsigned char prefix[2];
    while (full(c, prefix, 2, 0) == 0) {
        size_t len = (size_t)prefix[0] << 8 | prefix[1];
        if (full(c, q, len, 0) < 0)
            break;
        size_t n = respond(q, len, r, sizeof r, 1);
        prefix[0] = (unsigned char)(n >> 8), prefix[1] = (unsigned char)n;
        if (full(c, prefix, 2, 1) < 0 || full(c, r, n, 1) < 0)
            break;
    }
}

int dns_no_relay;  /* --no-relay: names beyond the hosts file are not asked of the node's resolver */

int serve_dns(const char *listen_text, const char *hosts_text)
{
    struct sockaddr_in at = {.sin_family = AF_INET};
    char host[INET_ADDRSTRLEN] = "";
    const char *colon = strrchr(listen_text, ':');
    long port = colon ? strtol(colon + 1, NULL, 10) : 0;
    if (colon && (size_t)(colon - listen_text) < sizeof host)
        memcpy(host, listen_text, (size_t)(colon - listen_text));
    if (!colon || inet_pton(AF_INET, host, &at.sin_addr) != 1 || port < 1 || port > 65535) {
        fprintf(stderr, NAME ": --serve-dns wants ADDR:PORT, got %s\n", listen_text);
        return EXIT_SETUP;
    }
    at.sin_port = htons((uint16_t)port);
    hosts_path = hosts_text;
    read_node_addresses();  /* a query from one of them may be another user's */
    if (!dns_no_relay)
        find_upstream();
    load_hosts();
    int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int on = 1;
    if (tcp >= 0)
        setsockopt(tcp, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (udp < 0 || tcp < 0 || bind(udp, (struct sockaddr *)&at, sizeof at) < 0 ||
        bind(tcp, (struct sockaddr *)&at, sizeof at) < 0 || listen(tcp, 64) < 0) {
        fprintf(stderr, NAME ": cannot listen on %s: %s\n", listen_text, strerror(errno));
        return EXIT_SETUP;
    }
    struct sigaction reap = {.sa_handler = SIG_IGN, .sa_flags = SA_NOCLDWAIT};
    sigaction(SIGCHLD, &reap, NULL);
    signal(SIGPIPE, SIG_IGN);
    static unsigned char q[4096], r[4096];
    struct pollfd fds[2] = {{udp, POLLIN, 0}, {tcp, POLLIN, 0}};
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, NAME ": poll: %s\n", strerror(errno));
            return 1;
        }
        if (fds[0].revents & POLLIN) {
            struct sockaddr_storage from;
            socklen_t from_len = sizeof from;
            ssize_t len = recvfrom(udp, q, sizeof q, 0, (struct sockaddr *)&from, &from_len);
            /* the project's names are its own: another user of the node gets no answer (the
             * tracer's --private does the same for the services) */
            if (len > 0 && foreign_datagram(udp, (const union sockaddr_any *)&from) == 1)
                len = 0;
            if (len > 0) {
                size_t n = local_answer(q, (size_t)len, r, 512);
                if (n)
                    sendto(udp, r, n, 0, (struct sockaddr *)&from, from_len);
                else if (fork() == 0) {  /* the node's resolver may take a while: not in everyone's way */
                    n = relay(q, (size_t)len, r, sizeof r, 0);
                    n = n ? n : failure(q, (size_t)len, r);
                    sendto(udp, r, n, 0, (struct sockaddr *)&from, from_len);
                    _exit(0);
                }
            }
        }
        if (fds[1].revents & POLLIN) {
            int c = accept4(tcp, NULL, NULL, SOCK_CLOEXEC);
            if (c >= 0 && foreign_connection(c) == 1) {
                close(c);
                c = -1;
            }
            if (c >= 0 && fork() == 0) {
                close(udp);
                close(tcp);
                serve_tcp(c);
                _exit(0);
            }
            if (c >= 0)
                close(c);
        }
    }
}

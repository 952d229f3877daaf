/* c2s-forward: one published port, the way Docker's userland proxy serves it.
 *
 *   c2s-forward LISTEN_ADDR:PORT TARGET_ADDR:PORT      (IPv6 addresses as [::]:8080 or :::8080)
 *   c2s-forward --version
 *
 * Listens on LISTEN_ADDR:PORT and relays every connection to TARGET_ADDR:PORT, both directions,
 * half-closes passed on. One child process per connection (the listener never blocks on a slow
 * peer); a child ends with its connection, or when the listener ends (PR_SET_PDEATHSIG), as
 * Docker's proxy drops its connections when the container stops.
 *
 * Exit codes: 1 and one line on stderr when it cannot listen (the address in use, a bad address),
 * 0 on SIGTERM/SIGINT. Linux, any libc; built static when compose2sif's package is built (setup.py)
 * so that it runs on any node.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUFFER (128 * 1024)

#ifndef C2S_VERSION
#define C2S_VERSION "unversioned"  /* the package build (setup.py) gives the version and source digest */
#endif

/* "ADDR:PORT", "[V6]:PORT" or "V6:PORT" (the last colon separates the port) into a socket address. */
static int parse(const char *text, struct sockaddr_storage *out, socklen_t *len)
{
    char host[128];
    const char *colon = strrchr(text, ':');
    size_t n;
    long port;
    char *end;
    struct sockaddr_in *v4 = (struct sockaddr_in *)out;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)out;

    if (!colon || colon == text || strlen(colon + 1) == 0)
        return -1;
    n = (size_t)(colon - text);
    if (text[0] == '[' && colon[-1] == ']') {
        text++;
        n -= 2;
    }
    if (n >= sizeof host)
        return -1;
    memcpy(host, text, n);
    host[n] = 0;
    port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535)
        return -1;
    memset(out, 0, sizeof *out);
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((unsigned short)port);
        *len = sizeof *v4;
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((unsigned short)port);
        *len = sizeof *v6;
    } else {
        return -1;
    }
    return 0;
}

static int write_all(int fd, const char *data, ssize_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, data, (size_t)n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        data += w;
        n -= w;
    }
    return 0;
}

/* Move what `from` has (poll said so) to `to`: through a pipe with splice(), so the bytes never
 * reach this process (twice the throughput of read/write), or read/write where splice cannot be
 * used. Returns the bytes moved, 0 at the end of `from`, -1 on an error. */
static ssize_t move(int from, int to, int pipe_fds[2])
{
    static char buffer[BUFFER];
    static int no_splice;
    ssize_t n, w;

    if (!no_splice && pipe_fds[0] >= 0) {
        n = splice(from, NULL, pipe_fds[1], NULL, BUFFER, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n >= 0 || (errno != EINVAL && errno != ENOSYS)) {
            for (ssize_t left = n; left > 0; left -= w) {
                w = splice(pipe_fds[0], NULL, to, NULL, (size_t)left, SPLICE_F_MOVE);
                if (w < 0 && errno == EINTR) {
                    w = 0;
                    continue;
                }
                if (w <= 0)
                    return -1;
            }
            return n;
        }
        no_splice = 1;
    }
    n = read(from, buffer, sizeof buffer);
    if (n > 0 && write_all(to, buffer, n) < 0)
        return -1;
    return n;
}

/* Relay between a and b until both directions have ended. */
static void relay(int a, int b)
{
    int sockets[2] = {a, b}, pipes[2][2], open_dirs = 2;
    struct pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};

    for (int i = 0; i < 2; i++) {
        if (pipe(pipes[i]) < 0)
            pipes[i][0] = pipes[i][1] = -1;
        else
            fcntl(pipes[i][1], F_SETPIPE_SZ, BUFFER);  /* (a smaller pipe where the limit is lower) */
    }
    while (open_dirs > 0) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        for (int i = 0; i < 2; i++) {
            ssize_t n;
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            n = move(sockets[i], sockets[1 - i], pipes[i]);
            if (n < 0 && (errno == EINTR || errno == EAGAIN))  /* nothing to move after all */
                continue;
            if (n == 0) {  /* this direction ended: pass the half-close on */
                shutdown(sockets[1 - i], SHUT_WR);
                fds[i].fd = -1;
                open_dirs--;
            } else if (n < 0) {
                return;
            }
        }
    }
}

static void serve(int client, const struct sockaddr_storage *target, socklen_t target_len)
{
    int one = 1, upstream;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)  /* the listener ended before the line above */
        _exit(0);
    upstream = socket(target->ss_family, SOCK_STREAM, 0);
    if (upstream < 0 || connect(upstream, (const struct sockaddr *)target, target_len) < 0)
        _exit(1);  /* the service does not listen (yet): the client sees its connection closed */
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    relay(client, upstream);
    _exit(0);
}

static void stop(int sig)
{
    (void)sig;
    _exit(0);
}

int main(int argc, char **argv)
{
    struct sockaddr_storage listen_at, target;
    socklen_t listen_len, target_len;
    int server, one = 1;

    if (argc == 2 && !strcmp(argv[1], "--version")) {
        printf("c2s-forward %s\n", C2S_VERSION);
        return 0;
    }
    if (argc != 3 || parse(argv[1], &listen_at, &listen_len) < 0 || parse(argv[2], &target, &target_len) < 0) {
        fprintf(stderr, "usage: c2s-forward LISTEN_ADDR:PORT TARGET_ADDR:PORT (numeric addresses)\n");
        return 1;
    }
    signal(SIGCHLD, SIG_IGN);  /* children are reaped by the kernel */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    server = socket(listen_at.ss_family, SOCK_STREAM, 0);
    if (server < 0) {
        fprintf(stderr, "c2s-forward: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  /* (TIME_WAIT only; never a live listener) */
    if (listen_at.ss_family == AF_INET6)  /* [::] serves IPv4 too, as Docker's proxy does */
        setsockopt(server, IPPROTO_IPV6, IPV6_V6ONLY, &(int){0}, sizeof(int));
    if (bind(server, (struct sockaddr *)&listen_at, listen_len) < 0 || listen(server, 512) < 0) {
        fprintf(stderr, "c2s-forward: cannot listen on %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    for (;;) {
        int client = accept(server, NULL, NULL);
        pid_t pid;
        if (client < 0)
            continue;  /* EINTR, a connection reset before it was accepted, or out of descriptors for now */
        pid = fork();
        if (pid == 0) {
            close(server);
            serve(client, &target, target_len);
        }
        close(client);
        if (pid < 0)
            usleep(10000);  /* out of processes: the client was dropped; do not spin */
    }
}

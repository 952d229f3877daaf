"""c2s-forward in Python: one published port, for a node whose architecture has no c2s-forward in the
package (run/lib/forward.sh runs it with the node's python3, and says so). Same command line, exit
codes and behaviour as intercept/forward.c:

    python3 c2s-forward.py LISTEN_ADDR:PORT TARGET_ADDR:PORT     (IPv6 as [::]:8080 or :::8080)

Relays every connection to TARGET both ways, half-closes passed on; 1 and one line on stderr when it
cannot listen, 0 on SIGTERM/SIGINT (its connections end with it). Python 3.6 and later (RHEL 7's)."""
import signal
import socket
import sys
import threading

BUFFER = 128 * 1024


def parse(text):
    """("ADDR", PORT, family) from "ADDR:PORT", "[V6]:PORT" or "V6:PORT" (the last colon separates)."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(text)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return host, int(port), family
    raise ValueError(text)


def pump(source, sink):
    try:
        while True:
            data = source.recv(BUFFER)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)  # the half-close, passed on
    except OSError:
        pass


def serve(client, target):
    host, port, family = target
    try:
        upstream = socket.socket(family, socket.SOCK_STREAM)
        upstream.connect((host, port))
    except OSError:
        client.close()
        return
    for sock in (client, upstream):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main(argv):
    if len(argv) == 2 and argv[1] == "--version":
        print("c2s-forward.py (Python fallback)")
        return 0
    try:
        if len(argv) != 3:
            raise ValueError(argv)
        listen_at, target = parse(argv[1]), parse(argv[2])
    except ValueError:
        sys.stderr.write("usage: c2s-forward.py LISTEN_ADDR:PORT TARGET_ADDR:PORT (numeric addresses)\n")
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    server = socket.socket(listen_at[2], socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT only; never a live listener
    if listen_at[2] == socket.AF_INET6:  # [::] serves IPv4 too, as Docker's proxy does
        server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    try:
        server.bind(listen_at[:2])
        server.listen(512)
    except OSError as exc:
        sys.stderr.write("c2s-forward: cannot listen on %s: %s\n" % (argv[1], exc.strerror))
        return 1
    while True:
        try:
            client, _ = server.accept()
        except OSError:
            continue
        threading.Thread(target=serve, args=(client, target), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""mpa_reject_fin.py - a raw iWARP responder over plain TCP for interop_siw.rs (D11).

  mpa_reject_fin.py BIND_IP PORT N [--separate]

Listens, accepts one connection, reads the MPA Request (and prints its flags and private
data), answers with an MPA Reply with R=1 (rev 2, the RFC 6581 IRD/ORD words 1/1) and N
bytes of private data 0x00, 0x01, ..., and closes. By default the Reply and the FIN leave
in one TCP segment (TCP_CORK held over the send and the shutdown); --separate sends the
Reply, waits until the peer closes (at most 2 s) and closes after it. Prints "listening"
once it listens. Exit 0.
"""
import socket
import struct
import sys


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        d = s.recv(n - len(buf))
        if not d:
            raise EOFError("closed after %d of %d bytes" % (len(buf), n))
        buf += d
    return buf


def main():
    ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    separate = "--separate" in sys.argv[4:]
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((ip, port))
    ls.listen(1)
    ls.settimeout(20)
    print("listening", flush=True)
    s, _ = ls.accept()
    s.settimeout(5)
    hdr = recv_exact(s, 20)
    pd = recv_exact(s, struct.unpack(">H", hdr[18:20])[0])
    print("request flags %#04x rev %d pd %s" % (hdr[16], hdr[17], pd.hex()), flush=True)
    data = bytes(i & 0xFF for i in range(n))
    reply = b"MPA ID Rep Frame" + bytes([0x30, 2]) + struct.pack(">H", 4 + n) + struct.pack(">HH", 1, 1) + data
    if separate:
        s.sendall(reply)
    else:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        s.sendall(reply)
        s.shutdown(socket.SHUT_WR)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
    # Until the peer closes (at most 2 s).
    s.settimeout(2)
    try:
        while s.recv(512):
            pass
    except OSError:
        pass
    s.close()
    print("closed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""siw_gap_peer.py - a raw iWARP initiator over plain TCP for interop_siw.rs (D1).

Sends an MPA Request (rev 2, RFC 6581 IRD 1 / ORD 1, no private data, no CRC), reads the
MPA Reply and sends RDMAP Sends (RFC 5040, untagged, QN 0) of 16 bytes each, CRC field 0.

  siw_gap_peer.py HOST PORT [--early SEC] [--first-delay SEC] [--second-after SEC] [--hold SEC]

--early SEC: send the first Send SEC seconds after the Request, BEFORE the Reply arrives
(an Initiator must not do that, RFC 5044 7.1.2; used to put bytes into siw's socket while
siw has read the Request but not yet attached the QP: the D1 gap, made wide).
Otherwise the first Send goes --first-delay seconds after the Reply. --second-after SEC:
a second Send SEC seconds after the first. --hold SEC: keep the connection open that
long afterwards, then close. Prints one line per step with the time since the Request.
Exit 0, or 1 when the Reply is missing, rejected or not an MPA Reply.
"""
import argparse
import socket
import struct
import sys
import time


def mpa_request():
    # Key, flags (S: enhanced), revision 2, PD_Length 4, then the IRD/ORD words.
    return b"MPA ID Req Frame" + bytes([0x10, 2]) + struct.pack(">H", 4) + struct.pack(">HH", 1, 1)


def fpdu_send(msn, payload):
    # DDP untagged: T=0 L=1 DV=01; RDMAP: RV=01 opcode 3 (Send); reserved/inv STag, QN, MSN, MO.
    hdr = bytes([0x41, 0x43]) + struct.pack(">IIII", 0, 0, msn, 0)
    ulpdu = hdr + payload
    body = struct.pack(">H", len(ulpdu)) + ulpdu
    body += b"\0" * (-len(body) % 4)
    return body + b"\0\0\0\0"  # CRC not negotiated: the field is there, zero


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        d = s.recv(n - len(buf))
        if not d:
            raise EOFError("closed after %d of %d bytes" % (len(buf), n))
        buf += d
    return buf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--early", type=float)
    ap.add_argument("--first-delay", type=float, default=0.05)
    ap.add_argument("--second-after", type=float)
    ap.add_argument("--hold", type=float, default=1.0)
    a = ap.parse_args()

    s = socket.create_connection((a.host, a.port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.monotonic()
    log = lambda msg: print("%.3f %s" % (time.monotonic() - t0, msg), flush=True)
    s.sendall(mpa_request())
    log("request sent")
    first = fpdu_send(1, b"D1-first-send-01")
    if a.early is not None:
        time.sleep(a.early)
        s.sendall(first)
        log("first send sent (before the reply)")
    hdr = recv_exact(s, 20)
    if hdr[:16] != b"MPA ID Rep Frame":
        log("not an MPA Reply: %s" % hdr.hex())
        return 1
    pd = recv_exact(s, struct.unpack(">H", hdr[18:20])[0])
    log("reply flags %#04x rev %d pd %s" % (hdr[16], hdr[17], pd.hex()))
    if hdr[16] & 0x20:
        log("rejected")
        return 1
    if a.early is None:
        time.sleep(a.first_delay)
        s.sendall(first)
        log("first send sent")
    if a.second_after is not None:
        time.sleep(a.second_after)
        s.sendall(fpdu_send(2, b"D1-second-send-2"))
        log("second send sent")
    time.sleep(a.hold)
    s.shutdown(socket.SHUT_WR)
    s.settimeout(2)
    try:
        while s.recv(4096):
            pass
    except OSError:
        pass
    s.close()
    log("closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

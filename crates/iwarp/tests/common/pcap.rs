//! Synthetic TCP conversations written as a classic pcap file (test helper).
//!
//! `etherparse` builds the Ethernet II / IPv4 / TCP frames (with their IPv4
//! header and TCP checksums) and `pcap-file` writes the LINKTYPE_ETHERNET
//! records; this module only keeps the sequence and acknowledgement numbers of
//! a conversation, so that `tshark -o tcp.check_checksum:TRUE` and its TCP
//! analysis accept the stream and hand the payload to the iWARP dissectors.
//! Nothing here knows about iWARP: [`Conversation::send`] takes raw TCP payload.

use etherparse::{PacketBuilder, TcpOptionElement};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use std::net::Ipv4Addr;
use std::time::Duration;

/// The pcap file being built.
pub struct Pcap {
    writer: PcapWriter<Vec<u8>>,
    /// Time of the next record, since the epoch.
    clock: Duration,
    frames: usize,
}

impl Default for Pcap {
    fn default() -> Self {
        Self::new()
    }
}

impl Pcap {
    /// An empty capture (microsecond timestamps, room for 256 KiB frames).
    pub fn new() -> Pcap {
        let header = PcapHeader {
            snaplen: 262_144,
            ..PcapHeader::default()
        };
        Pcap {
            writer: PcapWriter::with_header(Vec::new(), header).expect("a pcap header fits a Vec"),
            clock: Duration::from_secs(1_700_000_000),
            frames: 0,
        }
    }

    /// Number of records written so far (tshark's `frame.number` of the last one).
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// The pcap file.
    pub fn into_bytes(self) -> Vec<u8> {
        self.writer.into_writer()
    }

    fn record(&mut self, frame: &[u8]) {
        self.clock += Duration::from_micros(100);
        let len = u32::try_from(frame.len()).expect("frame fits a pcap record");
        self.writer
            .write_packet(&PcapPacket::new(self.clock, len, frame))
            .expect("a record fits a Vec");
        self.frames += 1;
    }
}

/// One end of a TCP connection.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint {
    pub mac: [u8; 6],
    pub ip: Ipv4Addr,
    pub port: u16,
}

/// Which side sends a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client (TCP active opener) to server.
    C2S,
    /// Server to client.
    S2C,
}

/// The TCP flags of one segment.
#[derive(Debug, Clone, Copy, Default)]
struct Flags {
    syn: bool,
    fin: bool,
    psh: bool,
    /// With ACK, the acknowledgement number.
    ack: Option<u32>,
}

/// A TCP connection between two endpoints inside a [`Pcap`].
pub struct Conversation {
    client: Endpoint,
    server: Endpoint,
    /// Next sequence number of each side: [client, server].
    next_seq: [u32; 2],
}

impl Conversation {
    /// Writes the three-way handshake (SYN with an MSS option, SYN-ACK, ACK).
    pub fn open(pcap: &mut Pcap, client: Endpoint, server: Endpoint, client_isn: u32, server_isn: u32) -> Self {
        let mut c = Conversation {
            client,
            server,
            next_seq: [client_isn, server_isn],
        };
        let syn = Flags {
            syn: true,
            ..Flags::default()
        };
        c.segment(pcap, Dir::C2S, syn, &[]);
        c.next_seq[0] = c.next_seq[0].wrapping_add(1);
        let syn_ack = Flags {
            ack: Some(c.next_seq[0]),
            ..syn
        };
        c.segment(pcap, Dir::S2C, syn_ack, &[]);
        c.next_seq[1] = c.next_seq[1].wrapping_add(1);
        c.segment(pcap, Dir::C2S, c.ack(Dir::C2S), &[]);
        c
    }

    /// Sends `payload` as one TCP segment (PSH|ACK) in direction `dir`.
    pub fn send(&mut self, pcap: &mut Pcap, dir: Dir, payload: &[u8]) {
        let flags = Flags {
            psh: true,
            ..self.ack(dir)
        };
        self.segment(pcap, dir, flags, payload);
        let i = self.index(dir);
        self.next_seq[i] = self.next_seq[i].wrapping_add(payload.len() as u32);
    }

    /// Graceful close: FIN from the client, FIN from the server, last ACK.
    pub fn close(&mut self, pcap: &mut Pcap) {
        for dir in [Dir::C2S, Dir::S2C] {
            let fin = Flags {
                fin: true,
                ..self.ack(dir)
            };
            self.segment(pcap, dir, fin, &[]);
            let i = self.index(dir);
            self.next_seq[i] = self.next_seq[i].wrapping_add(1);
        }
        self.segment(pcap, Dir::C2S, self.ack(Dir::C2S), &[]);
    }

    /// A plain ACK of everything the peer of `dir`'s sender has sent.
    fn ack(&self, dir: Dir) -> Flags {
        Flags {
            ack: Some(self.next_seq[1 - self.index(dir)]),
            ..Flags::default()
        }
    }

    fn index(&self, dir: Dir) -> usize {
        match dir {
            Dir::C2S => 0,
            Dir::S2C => 1,
        }
    }

    fn segment(&mut self, pcap: &mut Pcap, dir: Dir, flags: Flags, payload: &[u8]) {
        let (src, dst) = match dir {
            Dir::C2S => (self.client, self.server),
            Dir::S2C => (self.server, self.client),
        };
        let mut b = PacketBuilder::ethernet2(src.mac, dst.mac)
            .ipv4(src.ip.octets(), dst.ip.octets(), 64)
            .tcp(src.port, dst.port, self.next_seq[self.index(dir)], 65_535);
        if flags.syn {
            b = b
                .syn()
                .options(&[TcpOptionElement::MaximumSegmentSize(1460)])
                .expect("the MSS option fits");
        }
        if flags.fin {
            b = b.fin();
        }
        if flags.psh {
            b = b.psh();
        }
        if let Some(n) = flags.ack {
            b = b.ack(n);
        }
        let mut frame = Vec::with_capacity(b.size(payload.len()));
        b.write(&mut frame, payload).expect("the segment fits IPv4");
        pcap.record(&frame);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    use pcap_file::pcap::PcapReader;

    /// Every frame reads back from the file as Ethernet/IPv4/TCP with a correct TCP
    /// checksum, and the sequence numbers advance by the payload (and SYN/FIN).
    #[test]
    fn frames_read_back_with_valid_checksums_and_sequence() {
        let ep = |last: u8, port| Endpoint {
            mac: [2, 0, 0, 0, 0, last],
            ip: Ipv4Addr::new(10, 0, 0, last),
            port,
        };
        let mut pcap = Pcap::new();
        let mut c = Conversation::open(&mut pcap, ep(1, 40000), ep(2, 7174), 1000, 5000);
        c.send(&mut pcap, Dir::C2S, b"hello");
        c.send(&mut pcap, Dir::S2C, b"odd length");
        c.close(&mut pcap);
        assert_eq!(pcap.frames(), 8);
        let mut r = PcapReader::new(std::io::Cursor::new(pcap.into_bytes())).unwrap();
        let mut seqs = Vec::new();
        while let Some(p) = r.next_packet() {
            let p = p.unwrap();
            let s = SlicedPacket::from_ethernet(&p.data).unwrap();
            let (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Tcp(tcp))) = (s.net, s.transport) else {
                panic!("not IPv4/TCP");
            };
            let sum = tcp
                .to_header()
                .calc_checksum_ipv4(&ip.header().to_header(), tcp.payload())
                .unwrap();
            assert_eq!(sum, tcp.checksum());
            seqs.push((tcp.sequence_number(), tcp.acknowledgment_number()));
        }
        assert_eq!(seqs[..4], [(1000, 0), (5000, 1001), (1001, 5001), (1001, 5001)]);
        assert_eq!(seqs[4], (5001, 1006));
    }
}

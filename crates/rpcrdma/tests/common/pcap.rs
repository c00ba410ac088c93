//! A tiny classic-pcap writer for synthetic TCP conversations (test helper).
//!
//! Writes LINKTYPE_ETHERNET records of Ethernet II / IPv4 / TCP frames with
//! correct IPv4 header and TCP checksums, sequence and acknowledgement
//! numbers, so that `tshark -o tcp.check_checksum:TRUE` and its TCP analysis
//! accept the stream and hand the payload to the iWARP dissectors. Nothing
//! here knows about iWARP: [`Conversation::send`] takes raw TCP payload.

use std::net::Ipv4Addr;

/// The pcap file being built (global header written by [`Pcap::new`]).
pub struct Pcap {
    bytes: Vec<u8>,
    /// Microseconds since the epoch of the next record.
    clock_us: u64,
    frames: usize,
}

impl Default for Pcap {
    fn default() -> Self {
        Self::new()
    }
}

impl Pcap {
    pub fn new() -> Pcap {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes()); // magic, microsecond timestamps
        bytes.extend_from_slice(&2u16.to_le_bytes()); // version 2.4
        bytes.extend_from_slice(&4u16.to_le_bytes());
        bytes.extend_from_slice(&0i32.to_le_bytes()); // thiszone
        bytes.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
        bytes.extend_from_slice(&262_144u32.to_le_bytes()); // snaplen
        bytes.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
        Pcap {
            bytes,
            clock_us: 1_700_000_000_000_000,
            frames: 0,
        }
    }

    /// Number of records written so far (tshark's `frame.number` of the last one).
    pub fn frames(&self) -> usize {
        self.frames
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    fn record(&mut self, frame: &[u8]) {
        self.clock_us += 100;
        let (sec, usec) = (self.clock_us / 1_000_000, self.clock_us % 1_000_000);
        let len = u32::try_from(frame.len()).expect("frame fits a pcap record");
        self.bytes.extend_from_slice(&(sec as u32).to_le_bytes());
        self.bytes.extend_from_slice(&(usec as u32).to_le_bytes());
        self.bytes.extend_from_slice(&len.to_le_bytes());
        self.bytes.extend_from_slice(&len.to_le_bytes());
        self.bytes.extend_from_slice(frame);
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

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;

/// A TCP connection between two endpoints inside a [`Pcap`].
pub struct Conversation {
    client: Endpoint,
    server: Endpoint,
    /// Next sequence number of each side: [client, server].
    next_seq: [u32; 2],
    ip_id: u16,
}

/// The Internet checksum (RFC 1071) of `data`, starting from `sum`.
fn checksum(mut sum: u32, data: &[u8]) -> u16 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl Conversation {
    /// Writes the three-way handshake (SYN with an MSS option, SYN-ACK, ACK).
    pub fn open(pcap: &mut Pcap, client: Endpoint, server: Endpoint, client_isn: u32, server_isn: u32) -> Self {
        let mut c = Conversation {
            client,
            server,
            next_seq: [client_isn, server_isn],
            ip_id: 1,
        };
        let mss = [2u8, 4, 0x05, 0xb4]; // MSS 1460
        c.segment(pcap, Dir::C2S, SYN, &mss, &[], 0);
        c.next_seq[0] = c.next_seq[0].wrapping_add(1);
        c.segment(pcap, Dir::S2C, SYN | ACK, &mss, &[], c.next_seq[0]);
        c.next_seq[1] = c.next_seq[1].wrapping_add(1);
        c.segment(pcap, Dir::C2S, ACK, &[], &[], c.next_seq[1]);
        c
    }

    /// Sends `payload` as one TCP segment (PSH|ACK) in direction `dir`.
    pub fn send(&mut self, pcap: &mut Pcap, dir: Dir, payload: &[u8]) {
        let ack = self.next_seq[self.peer_index(dir)];
        self.segment(pcap, dir, PSH | ACK, &[], payload, ack);
        let i = self.index(dir);
        self.next_seq[i] = self.next_seq[i].wrapping_add(payload.len() as u32);
    }

    /// Graceful close: FIN from the client, FIN from the server, last ACK.
    pub fn close(&mut self, pcap: &mut Pcap) {
        self.segment(pcap, Dir::C2S, FIN | ACK, &[], &[], self.next_seq[1]);
        self.next_seq[0] = self.next_seq[0].wrapping_add(1);
        self.segment(pcap, Dir::S2C, FIN | ACK, &[], &[], self.next_seq[0]);
        self.next_seq[1] = self.next_seq[1].wrapping_add(1);
        self.segment(pcap, Dir::C2S, ACK, &[], &[], self.next_seq[1]);
    }

    fn index(&self, dir: Dir) -> usize {
        match dir {
            Dir::C2S => 0,
            Dir::S2C => 1,
        }
    }

    fn peer_index(&self, dir: Dir) -> usize {
        1 - self.index(dir)
    }

    fn segment(&mut self, pcap: &mut Pcap, dir: Dir, flags: u8, options: &[u8], payload: &[u8], ack: u32) {
        assert_eq!(options.len() % 4, 0, "TCP options are padded by the caller");
        let (src, dst) = match dir {
            Dir::C2S => (self.client, self.server),
            Dir::S2C => (self.server, self.client),
        };
        let seq = self.next_seq[self.index(dir)];
        let tcp_len = 20 + options.len() + payload.len();
        let mut tcp = Vec::with_capacity(tcp_len);
        tcp.extend_from_slice(&src.port.to_be_bytes());
        tcp.extend_from_slice(&dst.port.to_be_bytes());
        tcp.extend_from_slice(&seq.to_be_bytes());
        tcp.extend_from_slice(&(if flags & ACK != 0 { ack } else { 0 }).to_be_bytes());
        tcp.push((((20 + options.len()) / 4) as u8) << 4);
        tcp.push(flags);
        tcp.extend_from_slice(&65_535u16.to_be_bytes()); // window
        tcp.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
        tcp.extend_from_slice(options);
        tcp.extend_from_slice(payload);
        // Pseudo-header: source, destination, zero, protocol 6, TCP length.
        let mut pseudo = Vec::with_capacity(12);
        pseudo.extend_from_slice(&src.ip.octets());
        pseudo.extend_from_slice(&dst.ip.octets());
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&u16::try_from(tcp_len).expect("segment fits IPv4").to_be_bytes());
        let partial = pseudo
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum::<u32>();
        let csum = checksum(partial, &tcp);
        tcp[16..18].copy_from_slice(&csum.to_be_bytes());

        let total = u16::try_from(20 + tcp_len).expect("datagram fits IPv4");
        let mut ip = Vec::with_capacity(20);
        ip.push(0x45); // version 4, IHL 5
        ip.push(0);
        ip.extend_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&self.ip_id.to_be_bytes());
        ip.extend_from_slice(&0x4000u16.to_be_bytes()); // DF
        ip.push(64); // TTL
        ip.push(6); // TCP
        ip.extend_from_slice(&[0, 0]);
        ip.extend_from_slice(&src.ip.octets());
        ip.extend_from_slice(&dst.ip.octets());
        let csum = checksum(0, &ip);
        ip[10..12].copy_from_slice(&csum.to_be_bytes());
        self.ip_id = self.ip_id.wrapping_add(1);

        let mut frame = Vec::with_capacity(14 + ip.len() + tcp.len());
        frame.extend_from_slice(&dst.mac);
        frame.extend_from_slice(&src.mac);
        frame.extend_from_slice(&0x0800u16.to_be_bytes());
        frame.extend_from_slice(&ip);
        frame.extend_from_slice(&tcp);
        pcap.record(&frame);
    }
}

#[cfg(test)]
mod tests {
    use super::checksum;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: the one's-complement sum of 0001 f203 f4f5 f6f7 is ddf2.
        assert_eq!(checksum(0, &[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]), !0xddf2);
    }
}

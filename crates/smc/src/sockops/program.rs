//! The sock_ops program, generated with [`super::asm`].
//!
//! What it does, per callback (`struct bpf_sock_ops` op codes of `linux/bpf.h`):
//! - `TCP_CONNECT_CB` (an active open, before the SYN): when the remote port is chosen (or
//!   no ports were chosen), set `WRITE_HDR_OPT_CB_FLAG` on the socket.
//! - `TCP_LISTEN_CB`: when the local port is chosen, set `TCP_SAVE_SYN` (so the SYN's
//!   options can be read once the connection is established) and `WRITE_HDR_OPT_CB_FLAG`
//!   (request sockets and children inherit it).
//! - `HDR_OPT_LEN_CB` / `WRITE_HDR_OPT_CB`: on an outgoing SYN, reserve and write the
//!   6-octet option `FE 06 E2 D4 C3 D9`; on a SYN-ACK, in [`SynAck::Conditional`] mode only
//!   when the received SYN carried it (as Linux net/smc does, SMC-OPT-2's SHOULD), in
//!   [`SynAck::Always`] mode on every SYN-ACK of a chosen listener (SMC-OPT-2's MAY).
//! - `ACTIVE_ESTABLISHED_CB` (SYN-ACK received) / `PASSIVE_ESTABLISHED_CB` (the saved SYN):
//!   for sockets carrying the flag, look for the option and record 1 (found) or 0 in an LRU
//!   hash keyed by the socket cookie (`SO_COOKIE`), then clear the callback flags so no
//!   later segment pays for a callback.

use super::asm::{Asm, Cond, Insn, Label, R10, Unplaced};
use crate::wire::tcp_option::OPTION;

// Offsets in `struct bpf_sock_ops` (checked against linux/bpf.h of 6.x; stable uapi).
const OFF_OP: i16 = 0;
const OFF_REMOTE_PORT: i16 = 64;
const OFF_LOCAL_PORT: i16 = 68;
const OFF_CB_FLAGS: i16 = 84;
const OFF_SKB_TCP_FLAGS: i16 = 212;

// `enum bpf_sock_ops_cb` values.
const OP_TCP_CONNECT: i32 = 3;
const OP_ACTIVE_ESTABLISHED: i32 = 4;
const OP_PASSIVE_ESTABLISHED: i32 = 5;
const OP_TCP_LISTEN: i32 = 11;
const OP_HDR_OPT_LEN: i32 = 14;
const OP_WRITE_HDR_OPT: i32 = 15;

/// `BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG`.
const WRITE_HDR_OPT_CB_FLAG: i32 = 1 << 6;
/// `BPF_LOAD_HDR_OPT_TCP_SYN`.
const LOAD_HDR_OPT_TCP_SYN: i32 = 1;

// Helper ids (`enum bpf_func_id`).
const FN_MAP_UPDATE_ELEM: i32 = 2;
const FN_GET_SOCKET_COOKIE: i32 = 46;
const FN_SETSOCKOPT: i32 = 49;
const FN_SOCK_OPS_CB_FLAGS_SET: i32 = 59;
const FN_LOAD_HDR_OPT: i32 = 142;
const FN_STORE_HDR_OPT: i32 = 143;
const FN_RESERVE_HDR_OPT: i32 = 144;

const SOL_TCP: i32 = 6;
const TCP_SAVE_SYN: i32 = 27;
const TCPHDR_SYN: i32 = 0x02;
const TCPHDR_ACK: i32 = 0x10;

// Stack layout (below r10): option buffer at -8 (8 octets), cookie at -16, value at -20,
// setsockopt value at -24.
const BUF: i16 = -8;
const KEY: i16 = -16;
const VAL: i16 = -20;
const OPTVAL: i16 = -24;

/// When a listener's SYN-ACK carries the option (requirements SMC-OPT-2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SynAck {
    /// Only when the client's SYN carried it (Linux's behaviour; RFC 7609's SHOULD).
    #[default]
    Conditional,
    /// On every SYN-ACK (RFC 7609's MAY).
    Always,
}

/// Most ports the program compares against (a compare-and-jump each).
pub const MAX_PORTS: usize = 64;

/// Writes `FE 06 E2 D4 C3 D9 00 00` at r10-8 (the option, as a search key or to store).
fn option_to_stack(a: &mut Asm) {
    let lo = u32::from_le_bytes([OPTION[0], OPTION[1], OPTION[2], OPTION[3]]);
    let hi = u32::from_le_bytes([OPTION[4], OPTION[5], 0, 0]);
    a.st_w(R10, BUF, lo as i32);
    a.st_w(R10, BUF + 4, hi as i32);
}

/// Jumps to `matched` when r2 is one of `ports` (always when `ports` is empty), else to
/// `other`. (No fall-through: the verifier rejects unreachable instructions.)
fn port_filter(a: &mut Asm, ports: &[u16], matched: Label, other: Label) {
    if ports.is_empty() {
        a.ja(matched);
        return;
    }
    for p in ports {
        a.jump_imm(Cond::Eq, 2, i32::from(*p), matched);
    }
    a.ja(other);
}

/// Builds the program for `map_fd` (the LRU hash: u64 cookie -> u32) and `ports` (empty:
/// every port). `ports` longer than [`MAX_PORTS`] is the caller's error (checked there).
/// `synack` chooses when a SYN-ACK carries the option.
pub fn build(map_fd: i32, ports: &[u16], synack: SynAck) -> Result<Vec<Insn>, Unplaced> {
    let mut a = Asm::new();
    let done = a.label();
    let connect = a.label();
    let listen = a.label();
    let len = a.label();
    let write = a.label();
    let active = a.label();
    let passive = a.label();
    let set_flag = a.label();
    let listen_match = a.label();

    a.mov(6, 1); // r6 = ctx
    a.ldx_w(2, 6, OFF_OP);
    a.jump_imm(Cond::Eq, 2, OP_TCP_CONNECT, connect);
    a.jump_imm(Cond::Eq, 2, OP_TCP_LISTEN, listen);
    a.jump_imm(Cond::Eq, 2, OP_HDR_OPT_LEN, len);
    a.jump_imm(Cond::Eq, 2, OP_WRITE_HDR_OPT, write);
    a.jump_imm(Cond::Eq, 2, OP_ACTIVE_ESTABLISHED, active);
    a.jump_imm(Cond::Eq, 2, OP_PASSIVE_ESTABLISHED, passive);
    a.place(done);
    a.mov_imm(0, 1);
    a.exit();

    // Active open: remote_port is the network-order port in the upper 16 bits on a
    // little-endian host; a 32-bit byte swap gives the port.
    a.place(connect);
    a.ldx_w(2, 6, OFF_REMOTE_PORT);
    a.be32(2);
    port_filter(&mut a, ports, set_flag, done);

    a.place(set_flag);
    a.mov(1, 6);
    a.ldx_w(2, 6, OFF_CB_FLAGS);
    a.or_imm(2, WRITE_HDR_OPT_CB_FLAG);
    a.call(FN_SOCK_OPS_CB_FLAGS_SET);
    a.ja(done);

    // Listen: local_port is in host order.
    a.place(listen);
    a.ldx_w(2, 6, OFF_LOCAL_PORT);
    port_filter(&mut a, ports, listen_match, done);
    a.place(listen_match);
    a.st_w(R10, OPTVAL, 1);
    a.mov(1, 6);
    a.mov_imm(2, SOL_TCP);
    a.mov_imm(3, TCP_SAVE_SYN);
    a.mov(4, R10);
    a.add_imm(4, i32::from(OPTVAL));
    a.mov_imm(5, 4);
    a.call(FN_SETSOCKOPT);
    a.ja(set_flag);

    // Shared by LEN and WRITE: only SYN or SYN-ACK; in Conditional mode a SYN-ACK only if
    // the SYN offered SMC-R (no unreachable code in Always mode: the verifier rejects it).
    for (at, is_write) in [(len, false), (write, true)] {
        let go = a.label();
        a.place(at);
        a.ldx_w(2, 6, OFF_SKB_TCP_FLAGS);
        let syn = a.label();
        a.jump_imm(Cond::Set, 2, TCPHDR_SYN, syn);
        a.ja(done);
        a.place(syn);
        if synack == SynAck::Conditional {
            let synack_l = a.label();
            a.jump_imm(Cond::Set, 2, TCPHDR_ACK, synack_l);
            a.ja(go);
            a.place(synack_l);
            option_to_stack(&mut a);
            a.mov(1, 6);
            a.mov(2, R10);
            a.add_imm(2, i32::from(BUF));
            a.mov_imm(3, 8);
            a.mov_imm(4, LOAD_HDR_OPT_TCP_SYN);
            a.call(FN_LOAD_HDR_OPT);
            a.jump_imm(Cond::Sle, 0, 0, done);
        }
        a.place(go);
        a.mov(1, 6);
        if is_write {
            option_to_stack(&mut a);
            a.mov(2, R10);
            a.add_imm(2, i32::from(BUF));
            a.mov_imm(3, OPTION.len() as i32);
            a.mov_imm(4, 0);
            a.call(FN_STORE_HDR_OPT);
        } else {
            a.mov_imm(2, OPTION.len() as i32);
            a.mov_imm(3, 0);
            a.call(FN_RESERVE_HDR_OPT);
        }
        a.ja(done);
    }

    // Established: record whether the peer's SYN-ACK (active) or saved SYN (passive) had it.
    for (at, flags) in [(active, 0), (passive, LOAD_HDR_OPT_TCP_SYN)] {
        a.place(at);
        a.ldx_w(2, 6, OFF_CB_FLAGS);
        let ours = a.label();
        a.jump_imm(Cond::Set, 2, WRITE_HDR_OPT_CB_FLAG, ours);
        a.ja(done);
        a.place(ours);
        option_to_stack(&mut a);
        a.mov(1, 6);
        a.mov(2, R10);
        a.add_imm(2, i32::from(BUF));
        a.mov_imm(3, 8);
        a.mov_imm(4, flags);
        a.call(FN_LOAD_HDR_OPT);
        a.mov_imm(7, 0);
        let absent = a.label();
        a.jump_imm(Cond::Sle, 0, 0, absent);
        a.mov_imm(7, 1);
        a.place(absent);
        a.mov(1, 6);
        a.call(FN_GET_SOCKET_COOKIE);
        a.stx_dw(R10, KEY, 0);
        a.stx_w(R10, VAL, 7);
        a.ld_map_fd(1, map_fd);
        a.mov(2, R10);
        a.add_imm(2, i32::from(KEY));
        a.mov(3, R10);
        a.add_imm(3, i32::from(VAL));
        a.mov_imm(4, 0);
        a.call(FN_MAP_UPDATE_ELEM);
        a.mov(1, 6);
        a.mov_imm(2, 0);
        a.call(FN_SOCK_OPS_CB_FLAGS_SET);
        a.ja(done);
    }
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_and_stores_the_smc_option_octets() {
        let p = build(3, &[], SynAck::Conditional).unwrap();
        // The two stores of the option: FE 06 E2 D4 | C3 D9 00 00 (requirements A1.2).
        let lo = p.iter().find(|i| i.code == 0x62 && i.off == BUF).unwrap();
        let hi = p.iter().find(|i| i.code == 0x62 && i.off == BUF + 4).unwrap();
        assert_eq!(lo.imm.to_le_bytes(), [0xfe, 0x06, 0xe2, 0xd4]);
        assert_eq!(hi.imm.to_le_bytes(), [0xc3, 0xd9, 0, 0]);
        // Every map reference is the fd given.
        assert!(p.iter().filter(|i| i.code == 0x18).all(|i| i.imm == 3));
        // Last slot is reachable control flow (a jump), the verifier needs no fall-off end.
        assert_eq!(p.last().unwrap().code, 0x05);
    }

    #[test]
    fn port_list_adds_one_compare_per_port_twice() {
        let all = build(3, &[], SynAck::Conditional).unwrap().len();
        let two = build(3, &[80, 443], SynAck::Conditional).unwrap();
        assert!(two.len() > all);
        let cmp_443 = two.iter().filter(|i| i.code == 0x15 && i.imm == 443).count();
        assert_eq!(cmp_443, 2, "connect and listen each compare the port");
    }

    #[test]
    fn always_mode_skips_the_syn_lookup_before_a_synack() {
        let cond = build(3, &[], SynAck::Conditional).unwrap();
        let always = build(3, &[], SynAck::Always).unwrap();
        let syn_loads = |p: &[Insn]| {
            p.windows(2)
                .filter(|w| {
                    w[0] == Insn {
                        code: 0xb7,
                        dst: 4,
                        src: 0,
                        off: 0,
                        imm: 1,
                    } && w[1].imm == FN_LOAD_HDR_OPT
                })
                .count()
        };
        // Conditional: LEN, WRITE and PASSIVE_ESTABLISHED read the SYN; Always: only the
        // latter (the verifier rejects unreachable code, so the others are not emitted).
        assert_eq!(syn_loads(&cond), 3);
        assert_eq!(syn_loads(&always), 1);
    }
}

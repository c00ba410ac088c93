//! A minimal eBPF assembler: the handful of instructions the sock_ops program needs, with
//! forward labels resolved at [`Asm::finish`]. Encoding per the kernel's
//! `Documentation/bpf/standardization/instruction-set.rst` (8-octet slots: opcode, dst/src
//! nibbles, signed 16-bit offset, signed 32-bit immediate; `lddw` takes two slots).

/// One encoded 8-octet instruction slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    /// Opcode octet.
    pub code: u8,
    /// Destination register (low nibble of the register octet).
    pub dst: u8,
    /// Source register (high nibble).
    pub src: u8,
    /// Signed offset (jumps: in slots, relative to the next slot).
    pub off: i16,
    /// Signed immediate.
    pub imm: i32,
}

impl Insn {
    /// The 8 octets as the kernel reads them (little-endian host).
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = (self.src << 4) | (self.dst & 0x0f);
        b[2..4].copy_from_slice(&self.off.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_le_bytes());
        b
    }
}

/// Registers: r0 return value, r1-r5 arguments (clobbered by calls), r6-r9 callee-saved,
/// r10 read-only frame pointer.
pub type Reg = u8;
/// Frame pointer.
pub const R10: Reg = 10;

// Instruction classes, sizes, modes, operations (instruction-set.rst).
const CLS_LD: u8 = 0x00;
const CLS_LDX: u8 = 0x01;
const CLS_ST: u8 = 0x02;
const CLS_STX: u8 = 0x03;
const CLS_ALU: u8 = 0x04;
const CLS_JMP: u8 = 0x05;
const CLS_ALU64: u8 = 0x07;
const SZ_W: u8 = 0x00;
const SZ_DW: u8 = 0x18;
const MODE_IMM: u8 = 0x00;
const MODE_MEM: u8 = 0x60;
const SRC_K: u8 = 0x00;
const SRC_X: u8 = 0x08;
const OP_ADD: u8 = 0x00;
const OP_MOV: u8 = 0xb0;
const OP_OR: u8 = 0x40;
const OP_END: u8 = 0xd0;
const J_JA: u8 = 0x00;
const J_EQ: u8 = 0x10;
const J_SET: u8 = 0x40;
const J_SLE: u8 = 0xd0;
const J_SLT: u8 = 0xc0;
const J_CALL: u8 = 0x80;
const J_EXIT: u8 = 0x90;
/// `src` of an `lddw` whose immediate is a map file descriptor (BPF_PSEUDO_MAP_FD).
const PSEUDO_MAP_FD: u8 = 1;

/// Conditions for [`Asm::jump_imm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    /// `dst == imm`.
    Eq,
    /// `dst & imm != 0`.
    Set,
    /// `(s64)dst < imm`.
    Slt,
    /// `(s64)dst <= imm`.
    Sle,
}

/// A forward or backward jump target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label(usize);

/// The assembler: a list of slots, labels, and jumps waiting for them.
#[derive(Default, Debug)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    fixups: Vec<(usize, Label)>,
}

/// An assembly error: a label used but never placed.
#[derive(Debug, PartialEq, Eq)]
pub struct Unplaced;

impl Asm {
    /// An empty program.
    pub fn new() -> Self {
        Self::default()
    }
    fn push(&mut self, code: u8, dst: Reg, src: Reg, off: i16, imm: i32) {
        self.insns.push(Insn {
            code,
            dst,
            src,
            off,
            imm,
        });
    }
    /// A new, not yet placed label.
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }
    /// Places `l` at the next instruction.
    pub fn place(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }
    /// `dst = src` (64-bit).
    pub fn mov(&mut self, dst: Reg, src: Reg) {
        self.push(CLS_ALU64 | OP_MOV | SRC_X, dst, src, 0, 0);
    }
    /// `dst = imm` (64-bit, sign-extended).
    pub fn mov_imm(&mut self, dst: Reg, imm: i32) {
        self.push(CLS_ALU64 | OP_MOV | SRC_K, dst, 0, 0, imm);
    }
    /// `dst += imm` (64-bit).
    pub fn add_imm(&mut self, dst: Reg, imm: i32) {
        self.push(CLS_ALU64 | OP_ADD | SRC_K, dst, 0, 0, imm);
    }
    /// `dst |= imm` (64-bit).
    pub fn or_imm(&mut self, dst: Reg, imm: i32) {
        self.push(CLS_ALU64 | OP_OR | SRC_K, dst, 0, 0, imm);
    }
    /// `dst = htobe32(dst)` (a byte swap on a little-endian host).
    pub fn be32(&mut self, dst: Reg) {
        self.push(CLS_ALU | OP_END | SRC_X, dst, 0, 0, 32);
    }
    /// `dst = *(u32 *)(src + off)`.
    pub fn ldx_w(&mut self, dst: Reg, src: Reg, off: i16) {
        self.push(CLS_LDX | SZ_W | MODE_MEM, dst, src, off, 0);
    }
    /// `*(u32 *)(dst + off) = imm`.
    pub fn st_w(&mut self, dst: Reg, off: i16, imm: i32) {
        self.push(CLS_ST | SZ_W | MODE_MEM, dst, 0, off, imm);
    }
    /// `*(u32 *)(dst + off) = src`.
    pub fn stx_w(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(CLS_STX | SZ_W | MODE_MEM, dst, src, off, 0);
    }
    /// `*(u64 *)(dst + off) = src`.
    pub fn stx_dw(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(CLS_STX | SZ_DW | MODE_MEM, dst, src, off, 0);
    }
    /// `dst = map` (two slots; the kernel swaps the fd for the map pointer at load).
    pub fn ld_map_fd(&mut self, dst: Reg, fd: i32) {
        self.push(CLS_LD | SZ_DW | MODE_IMM, dst, PSEUDO_MAP_FD, 0, fd);
        self.push(0, 0, 0, 0, 0);
    }
    /// `if cond(dst, imm) goto l`.
    pub fn jump_imm(&mut self, cond: Cond, dst: Reg, imm: i32, l: Label) {
        let op = match cond {
            Cond::Eq => J_EQ,
            Cond::Set => J_SET,
            Cond::Slt => J_SLT,
            Cond::Sle => J_SLE,
        };
        self.fixups.push((self.insns.len(), l));
        self.push(CLS_JMP | op | SRC_K, dst, 0, 0, imm);
    }
    /// `goto l`.
    pub fn ja(&mut self, l: Label) {
        self.fixups.push((self.insns.len(), l));
        self.push(CLS_JMP | J_JA, 0, 0, 0, 0);
    }
    /// Calls helper number `id` (arguments in r1-r5, result in r0).
    pub fn call(&mut self, id: i32) {
        self.push(CLS_JMP | J_CALL, 0, 0, 0, id);
    }
    /// `return r0`.
    pub fn exit(&mut self) {
        self.push(CLS_JMP | J_EXIT, 0, 0, 0, 0);
    }
    /// Resolves the jumps; fails when a label was never placed or is out of jump range.
    pub fn finish(mut self) -> Result<Vec<Insn>, Unplaced> {
        for (at, l) in &self.fixups {
            let target = self.labels[l.0].ok_or(Unplaced)?;
            let off = target as i64 - (*at as i64 + 1);
            self.insns[*at].off = i16::try_from(off).map_err(|_| Unplaced)?;
        }
        Ok(self.insns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_the_instruction_set_document() {
        let mut a = Asm::new();
        a.mov(6, 1); // bf 16 00 00 00000000
        a.ldx_w(2, 6, 212); // 61 62 d4 00
        a.be32(2); // dc 02 00 00 20000000
        a.st_w(R10, -8, 0xd4e2_06fe_u32 as i32); // 62 0a f8 ff fe 06 e2 d4
        a.ld_map_fd(1, 7); // 18 11 00 00 07000000 + zero slot
        a.call(143); // 85 00 00 00 8f000000
        a.exit(); // 95
        let b: Vec<[u8; 8]> = a.finish().unwrap().into_iter().map(Insn::to_bytes).collect();
        assert_eq!(b[0], [0xbf, 0x16, 0, 0, 0, 0, 0, 0]);
        assert_eq!(b[1], [0x61, 0x62, 0xd4, 0, 0, 0, 0, 0]);
        assert_eq!(b[2], [0xdc, 0x02, 0, 0, 32, 0, 0, 0]);
        assert_eq!(b[3], [0x62, 0x0a, 0xf8, 0xff, 0xfe, 0x06, 0xe2, 0xd4]);
        assert_eq!(b[4], [0x18, 0x11, 0, 0, 7, 0, 0, 0]);
        assert_eq!(b[5], [0; 8]);
        assert_eq!(b[6], [0x85, 0, 0, 0, 143, 0, 0, 0]);
        assert_eq!(b[7], [0x95, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn jumps_are_relative_to_the_next_slot_both_ways() {
        let mut a = Asm::new();
        let back = a.label();
        let fwd = a.label();
        a.place(back);
        a.jump_imm(Cond::Eq, 2, 3, fwd); // 0 -> 2: off 1
        a.ja(back); // 1 -> 0: off -2
        a.place(fwd);
        a.exit();
        let p = a.finish().unwrap();
        assert_eq!((p[0].code, p[0].off, p[0].imm), (0x15, 1, 3));
        assert_eq!((p[1].code, p[1].off), (0x05, -2));
    }

    #[test]
    fn an_unplaced_label_is_an_error() {
        let mut a = Asm::new();
        let l = a.label();
        a.ja(l);
        assert_eq!(a.finish(), Err(Unplaced));
    }
}

//! eBPF instruction encoding: just the instructions the kubelet probe program needs, as a
//! small typed builder, so the program is assembled on the stable toolchain with no clang.
//!
//! Layout of one instruction (`struct bpf_insn`, Documentation/bpf/standardization/
//! instruction-set.rst): 8 bytes — `code` (u8: class | size/op | mode/source), `regs` (u8:
//! destination register in the low nibble, source register in the high nibble on
//! little-endian hosts), `off` (i16), `imm` (i32), both in host byte order.

/// A register. `R1` holds the context pointer on entry, `R0` the return value on exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reg {
    /// Return value.
    R0 = 0,
    /// First argument: the program's context.
    R1 = 1,
    /// Scratch.
    R2 = 2,
}

// Instruction classes.
const BPF_LDX: u8 = 0x01;
const BPF_STX: u8 = 0x03;
const BPF_ALU: u8 = 0x04;
const BPF_JMP: u8 = 0x05;
const BPF_ALU64: u8 = 0x07;
// Load/store: size and mode.
const BPF_W: u8 = 0x00;
const BPF_MEM: u8 = 0x60;
// ALU/JMP: operation and source.
const BPF_K: u8 = 0x00;
const BPF_OR: u8 = 0x40;
const BPF_EXIT: u8 = 0x90;
const BPF_MOV: u8 = 0xb0;

/// One eBPF instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    dst: Reg,
    src: Reg,
    off: i16,
    imm: i32,
}

impl Insn {
    /// `dst = *(u32 *)(src + off)`
    pub fn load_u32(dst: Reg, src: Reg, off: i16) -> Self {
        Insn {
            code: BPF_LDX | BPF_MEM | BPF_W,
            dst,
            src,
            off,
            imm: 0,
        }
    }

    /// `*(u32 *)(dst + off) = src`
    pub fn store_u32(dst: Reg, off: i16, src: Reg) -> Self {
        Insn {
            code: BPF_STX | BPF_MEM | BPF_W,
            dst,
            src,
            off,
            imm: 0,
        }
    }

    /// `dst = (u32)(dst | imm)`: 32-bit, so no sign extension of `imm` reaches the upper half.
    pub fn or32_imm(dst: Reg, imm: u32) -> Self {
        Insn {
            code: BPF_ALU | BPF_OR | BPF_K,
            dst,
            src: Reg::R0,
            off: 0,
            // The kernel reads the field as the 32 bits of the operand: reinterpret, not convert.
            imm: imm as i32,
        }
    }

    /// `dst = imm` (64-bit move of a sign-extended immediate).
    pub fn mov64_imm(dst: Reg, imm: i32) -> Self {
        Insn {
            code: BPF_ALU64 | BPF_MOV | BPF_K,
            dst,
            src: Reg::R0,
            off: 0,
            imm,
        }
    }

    /// `return r0`
    pub fn exit() -> Self {
        Insn {
            code: BPF_JMP | BPF_EXIT,
            dst: Reg::R0,
            src: Reg::R0,
            off: 0,
            imm: 0,
        }
    }

    /// The 8 bytes the kernel reads, in host byte order.
    pub fn encode(self) -> [u8; 8] {
        let (dst, src) = (self.dst as u8, self.src as u8);
        // `__u8 dst_reg:4, src_reg:4` — C bitfields fill from the least significant bit on
        // little-endian ABIs and from the most significant bit on big-endian ones.
        let regs = if cfg!(target_endian = "little") {
            src << 4 | dst
        } else {
            dst << 4 | src
        };
        let off = self.off.to_ne_bytes();
        let imm = self.imm.to_ne_bytes();
        [
            self.code, regs, off[0], off[1], imm[0], imm[1], imm[2], imm[3],
        ]
    }
}

#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;

    /// Splits an encoded instruction into the documented fields.
    fn fields(bytes: [u8; 8]) -> (u8, u8, u8, i16, i32) {
        (
            bytes[0],
            bytes[1] & 0x0f,
            bytes[1] >> 4,
            i16::from_le_bytes([bytes[2], bytes[3]]),
            i32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        )
    }

    // Expected opcodes are written as the kernel's own numbers (uapi linux/bpf_common.h and
    // linux/bpf.h), e.g. BPF_LDX|BPF_MEM|BPF_W == 0x61, as `gcc` prints for those macros.

    #[test]
    fn load_u32_is_ldxw() {
        let b = Insn::load_u32(Reg::R2, Reg::R1, 16).encode();
        assert_eq!(fields(b), (0x61, 2, 1, 16, 0));
        assert_eq!(b, [0x61, 0x12, 0x10, 0x00, 0, 0, 0, 0]);
    }

    #[test]
    fn store_u32_is_stxw() {
        let b = Insn::store_u32(Reg::R1, 16, Reg::R2).encode();
        assert_eq!(fields(b), (0x63, 1, 2, 16, 0));
        assert_eq!(b, [0x63, 0x21, 0x10, 0x00, 0, 0, 0, 0]);
    }

    #[test]
    fn negative_offset_is_twos_complement_little_endian() {
        let b = Insn::load_u32(Reg::R0, Reg::R1, -4).encode();
        assert_eq!(&b[2..4], &[0xfc, 0xff]);
    }

    #[test]
    fn or32_imm_keeps_all_32_bits() {
        let b = Insn::or32_imm(Reg::R2, 0x8000_1000).encode();
        assert_eq!(fields(b), (0x44, 2, 0, 0, 0x8000_1000u32 as i32));
        assert_eq!(&b[4..], &[0x00, 0x10, 0x00, 0x80]);
    }

    #[test]
    fn mov64_imm_is_0xb7() {
        let b = Insn::mov64_imm(Reg::R0, 1).encode();
        assert_eq!(b, [0xb7, 0x00, 0, 0, 0x01, 0, 0, 0]);
    }

    #[test]
    fn exit_is_0x95_with_nothing_else() {
        assert_eq!(Insn::exit().encode(), [0x95, 0, 0, 0, 0, 0, 0, 0]);
    }
}

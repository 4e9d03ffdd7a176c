//! Signature-agnostic forwarding: each forwarded `ncclX`/`pncclX` is a three-instruction naked
//! function that jumps through its slot in [`crate::real::SLOTS`], so arguments (registers,
//! stack, the by-value `ncclUniqueId` and `ncclTeam_t`) and results pass untouched whatever the
//! signature. While the slot is still 0 (first call, or a function the real library lacks) it
//! enters [`slow_path`], which saves the argument registers, asks [`crate::real::resolve_slot`]
//! where to go, restores them and jumps there.
//!
//! Naked Rust functions rather than C or assembly objects built by a build script: rustc exports
//! exactly the `#[no_mangle]` items of a cdylib (its own version script), so symbols from foreign
//! objects or `global_asm!` would stay hidden, and a second version script fails under GNU ld.

#![allow(non_snake_case)]

use crate::real::{resolve_slot, SLOTS};

/// Entered by a jump from a trampoline with the table index in r11 and the caller's argument
/// registers intact; leaves by a jump to the resolved address with them restored.
#[unsafe(naked)]
unsafe extern "C" fn slow_path() {
    core::arch::naked_asm!(
        // On entry rsp is 8 mod 16 (the caller's return address): 7 pushes make it 0 mod 16.
        "push rdi",
        "push rsi",
        "push rdx",
        "push rcx",
        "push r8",
        "push r9",
        "push rax",
        "sub rsp, 128",
        "movdqu [rsp], xmm0",
        "movdqu [rsp + 16], xmm1",
        "movdqu [rsp + 32], xmm2",
        "movdqu [rsp + 48], xmm3",
        "movdqu [rsp + 64], xmm4",
        "movdqu [rsp + 80], xmm5",
        "movdqu [rsp + 96], xmm6",
        "movdqu [rsp + 112], xmm7",
        "mov rdi, r11",
        "call {resolve}",
        "mov r11, rax",
        "movdqu xmm0, [rsp]",
        "movdqu xmm1, [rsp + 16]",
        "movdqu xmm2, [rsp + 32]",
        "movdqu xmm3, [rsp + 48]",
        "movdqu xmm4, [rsp + 64]",
        "movdqu xmm5, [rsp + 80]",
        "movdqu xmm6, [rsp + 96]",
        "movdqu xmm7, [rsp + 112]",
        "add rsp, 128",
        "pop rax",
        "pop r9",
        "pop r8",
        "pop rcx",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "jmp r11",
        resolve = sym resolve_slot,
    )
}

/// An exported function `$name` that forwards to table entry `$idx`.
macro_rules! trampoline {
    ($name:ident, $idx:expr) => {
        #[doc = concat!("`", stringify!($name), "`: forwarded to the real NCCL.")]
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                "mov rax, qword ptr [rip + {slots} + {off}]",
                "test rax, rax",
                "jz 2f",
                "jmp rax",
                "2:",
                "mov r11d, {idx}",
                "jmp {slow}",
                slots = sym SLOTS,
                off = const $idx * 8,
                idx = const $idx,
                slow = sym slow_path,
            )
        }
    };
}

include!(concat!(env!("OUT_DIR"), "/trampolines.rs"));

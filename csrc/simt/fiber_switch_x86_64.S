/* Context switch for the SIMT emulator's fibers (x86-64 System V).
 *
 * void w4k_simt_fiber_switch(void** save_sp, void* load_sp)
 *   Saves the callee-saved state of the running context on its own stack, stores that stack
 *   pointer into *save_sp, then resumes the context whose saved stack pointer is load_sp.
 *   Everything caller-saved is already dead at a call site, so only rbx, rbp, r12-r15, the
 *   MXCSR and the x87 control word have to survive the switch.
 *
 * Saved frame, from the saved stack pointer upwards (built by hand for a new fiber in fiber.h):
 *   [sp+0]  MXCSR (4 bytes), x87 control word (2 bytes), 2 bytes padding
 *   [sp+8]  r15   [sp+16] r14   [sp+24] r13   [sp+32] r12   [sp+40] rbx   [sp+48] rbp
 *   [sp+56] return address
 * A new fiber's "return address" is w4k_simt_fiber_trampoline, with r12 = argument and
 * r13 = entry function; the frame sits at a 16-byte aligned address so that the trampoline's
 * call leaves the entry function with the ABI's stack alignment.
 */
        .text
        .globl  w4k_simt_fiber_switch
        .hidden w4k_simt_fiber_switch
        .type   w4k_simt_fiber_switch, @function
        .p2align 4
w4k_simt_fiber_switch:
        .cfi_startproc
        pushq   %rbp
        .cfi_adjust_cfa_offset 8
        pushq   %rbx
        .cfi_adjust_cfa_offset 8
        pushq   %r12
        .cfi_adjust_cfa_offset 8
        pushq   %r13
        .cfi_adjust_cfa_offset 8
        pushq   %r14
        .cfi_adjust_cfa_offset 8
        pushq   %r15
        .cfi_adjust_cfa_offset 8
        subq    $8, %rsp
        .cfi_adjust_cfa_offset 8
        stmxcsr (%rsp)
        fnstcw  4(%rsp)
        movq    %rsp, (%rdi)
        movq    %rsi, %rsp
        ldmxcsr (%rsp)
        fldcw   4(%rsp)
        addq    $8, %rsp
        popq    %r15
        popq    %r14
        popq    %r13
        popq    %r12
        popq    %rbx
        popq    %rbp
        ret
        .cfi_endproc
        .size   w4k_simt_fiber_switch, .-w4k_simt_fiber_switch

/* First code a new fiber runs: call entry(arg), which never returns (it switches away for
 * the last time). rip is marked undefined so debuggers and unwinders stop here instead of
 * walking into the garbage above the fiber's stack. */
        .globl  w4k_simt_fiber_trampoline
        .hidden w4k_simt_fiber_trampoline
        .type   w4k_simt_fiber_trampoline, @function
        .p2align 4
w4k_simt_fiber_trampoline:
        .cfi_startproc
        .cfi_undefined rip
        movq    %r12, %rdi
        callq   *%r13
        ud2
        .cfi_endproc
        .size   w4k_simt_fiber_trampoline, .-w4k_simt_fiber_trampoline

        .section .note.GNU-stack,"",@progbits

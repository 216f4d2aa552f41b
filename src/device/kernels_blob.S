/* The CUDA kernels' fatbin (built by nvcc from kernels.cu) as bytes in the
 * library's read-only data, hidden from its exported symbols. STK_FATBIN is
 * the file's path, given by the Makefile. */
    .section .rodata
    .balign 64
    .globl stk__cuda_fatbin
    .hidden stk__cuda_fatbin
    .type stk__cuda_fatbin, @object
stk__cuda_fatbin:
    .incbin STK_FATBIN
stk__cuda_fatbin_end:
    .balign 8
    .globl stk__cuda_fatbin_size
    .hidden stk__cuda_fatbin_size
    .type stk__cuda_fatbin_size, @object
stk__cuda_fatbin_size:
    .quad stk__cuda_fatbin_end - stk__cuda_fatbin
    .section .note.GNU-stack,"",@progbits

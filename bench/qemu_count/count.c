/*
 * A qemu user-mode TCG plugin that counts the aarch64 instructions a program
 * executes, by class (bench/counted.py reads its output).
 *
 *   qemu-aarch64 -plugin count.so,out=FILE ...   (FILE: "class count" lines at exit)
 *
 * Each instruction is classified once, when qemu translates its block, from its
 * encoding (Arm ARM, "A64 instruction set encoding"; no disassembler, whose
 * version would decide what it names); each class's count in the block is then
 * added inline, without a callback, every time the block runs. A block left
 * midway (a fault, a signal) still counts whole: no such exits in the code
 * measured here. The counters are plain adds, not atomic: count one thread.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

enum insn_class {
    FP_MUL,      /* FP/ASIMD multiply and multiply-accumulate: fmla fmls fmul fmulx fmadd ... */
    INT_MUL_LONG, /* ASIMD integer widening multiply (-accumulate): smull umull smlal umlal smlsl umlsl */
    PAIRWISE_ACC, /* ASIMD pairwise add and accumulate long: sadalp uadalp (what sums the products above) */
    DOT,         /* ASIMD dot product: sdot udot */
    LOAD_STORE,  /* every load and store, integer and vector */
    SIMD_OTHER,  /* the rest of the FP/ASIMD data processing (add, shifts, moves, converts ...) */
    OTHER,       /* the rest: integer, branches, system */
    CLASSES
};

static const char *class_names[CLASSES] = {
    "fp_mul", "int_mul_long", "pairwise_add_long", "dot", "load_store", "simd_other", "other",
};

static uint64_t counts[CLASSES];
static char out_path[4096];

static int is(uint32_t insn, uint32_t mask, uint32_t value)
{
    return (insn & mask) == value;
}

static enum insn_class classify(uint32_t insn)
{
    uint32_t op12 = (insn >> 12) & 0xf;  /* the opcode field of the ASIMD groups below */

    if (is(insn, 0x0a000000, 0x08000000)) {  /* op0 x1x0: loads and stores */
        return LOAD_STORE;
    }
    if (!is(insn, 0x0e000000, 0x0e000000)) {  /* not op0 x111: scalar FP and ASIMD */
        return OTHER;
    }
    /* ASIMD three same: 0 Q U 01110 size 1 Rm opcode(5) 1 Rn Rd */
    if (is(insn, 0x9f200400, 0x0e200400)) {
        uint32_t opcode = (insn >> 11) & 0x1f;
        if (opcode == 0x19 && !(insn & (1u << 29))) {
            return FP_MUL;                                      /* fmla, fmls */
        }
        if (opcode == 0x1b) {
            return FP_MUL;                                      /* fmul (U=1), fmulx (U=0) */
        }
        return SIMD_OTHER;
    }
    /* ASIMD three different: 0 Q U 01110 size 1 Rm opcode(4) 00 Rn Rd */
    if (is(insn, 0x9f200c00, 0x0e200000)) {
        if (op12 == 0x8 || op12 == 0xa || op12 == 0xc) {
            return INT_MUL_LONG;                                /* [su]mlal, [su]mlsl, [su]mull */
        }
        return SIMD_OTHER;
    }
    /* ASIMD two-register misc, opcode 00110: sadalp, uadalp */
    if (is(insn, 0x9f3ffc00, 0x0e206800)) {
        return PAIRWISE_ACC;
    }
    /* ASIMD three same extra, opcode 0010 with size 10: sdot, udot (vector) */
    if (is(insn, 0x9fe0fc00, 0x0e809400)) {
        return DOT;
    }
    /* ASIMD by element: 0 Q U 01111 size L M Rm opcode(4) H 0 Rn Rd */
    if (is(insn, 0x9f000400, 0x0f000000)) {
        int u = (insn >> 29) & 1;
        uint32_t size = (insn >> 22) & 3;
        if (op12 == 0xe && size == 2) {
            return DOT;                                         /* sdot, udot (by element) */
        }
        if (op12 == 0x2 || op12 == 0x6 || op12 == 0xa) {
            return INT_MUL_LONG;                                /* [su]mlal, [su]mlsl, [su]mull */
        }
        if (!u && (op12 == 0x1 || op12 == 0x5 || op12 == 0x9) && size != 1) {
            return FP_MUL;                                      /* fmla, fmls, fmul (size 00: FP16) */
        }
        if (u && op12 == 0x9 && size != 1) {
            return FP_MUL;                                      /* fmulx */
        }
        return SIMD_OTHER;
    }
    /* scalar FP data processing, 3 source: fmadd fmsub fnmadd fnmsub */
    if (is(insn, 0xff000000, 0x1f000000)) {
        return FP_MUL;
    }
    /* scalar FP data processing, 2 source: opcode 0000 fmul, 1000 fnmul */
    if (is(insn, 0xff200c00, 0x1e200800) && (op12 == 0x0 || op12 == 0x8)) {
        return FP_MUL;
    }
    return SIMD_OTHER;
}

static void on_translate(qemu_plugin_id_t id __attribute__((unused)), struct qemu_plugin_tb *tb)
{
    uint64_t in_block[CLASSES] = {0};
    size_t n = qemu_plugin_tb_n_insns(tb);

    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint32_t word;
        memcpy(&word, qemu_plugin_insn_data(insn), sizeof(word));  /* aarch64: 4 bytes, little-endian */
        in_block[classify(word)]++;
    }
    for (int c = 0; c < CLASSES; c++) {
        if (in_block[c]) {
            qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &counts[c], in_block[c]);
        }
    }
}

static void on_exit(qemu_plugin_id_t id __attribute__((unused)), void *p __attribute__((unused)))
{
    FILE *f = out_path[0] ? fopen(out_path, "w") : stderr;
    if (!f) {
        perror(out_path);
        return;
    }
    for (int c = 0; c < CLASSES; c++) {
        fprintf(f, "%s %" PRIu64 "\n", class_names[c], counts[c]);
    }
    if (f != stderr) {
        fclose(f);
    }
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            snprintf(out_path, sizeof(out_path), "%s", argv[i] + 4);
        } else {
            fprintf(stderr, "count.so: unknown argument %s (out=FILE)\n", argv[i]);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, on_exit, NULL);
    return 0;
}

// CRC-32C (Castagnoli): the processor's CRC-32C instructions on x86-64 (SSE4.2) and on ARMv8
// (FEAT_CRC32, mandatory from ARMv8.1), a table-driven fallback (slicing by 8) otherwise. Which
// one runs is decided once per process, by what the processor reports (`__builtin_cpu_supports`
// on x86-64, `baton_cpu_has_crc32` of the platform header on ARM). All give the same values:
// scripts/check-crc32c.sh compares them, the ARM one under qemu-aarch64.
#include "CBatonShims.h"

static uint32_t baton_crc_table[8][256];
static int baton_crc_table_ready = 0;

static void baton_crc_init_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = i;
        for (int k = 0; k < 8; k++) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
        baton_crc_table[0][i] = crc;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = baton_crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            crc = baton_crc_table[0][crc & 0xff] ^ (crc >> 8);
            baton_crc_table[t][i] = crc;
        }
    }
    __atomic_store_n(&baton_crc_table_ready, 1, __ATOMIC_RELEASE);
}

static uint32_t baton_crc32c_sw(uint32_t crc, const uint8_t *p, size_t n) {
    if (!__atomic_load_n(&baton_crc_table_ready, __ATOMIC_ACQUIRE)) baton_crc_init_table();
    crc = ~crc;
    while (n >= 8) {
        uint64_t word;
        __builtin_memcpy(&word, p, 8);
        word ^= crc;
        crc = baton_crc_table[7][word & 0xff] ^ baton_crc_table[6][(word >> 8) & 0xff] ^
              baton_crc_table[5][(word >> 16) & 0xff] ^ baton_crc_table[4][(word >> 24) & 0xff] ^
              baton_crc_table[3][(word >> 32) & 0xff] ^ baton_crc_table[2][(word >> 40) & 0xff] ^
              baton_crc_table[1][(word >> 48) & 0xff] ^ baton_crc_table[0][word >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = baton_crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

// The instructions take several cycles each but can start one every cycle (three and one on
// x86-64), so one chain of them, each waiting for the one before, runs at a fraction of the
// processor's pace. Long inputs are cut into three
// interleaved streams of `BATON_CRC_STREAM` bytes whose CRCs are computed side by side, then
// joined: for the CRC register (before the final inversion), running over a block B from a
// value r gives shift_B(r) ^ crc(0, B), where shift_B, running over |B| zero bytes, is linear in
// r. baton_crc_shift holds shift for BATON_CRC_STREAM bytes, one table per byte of r (as zlib's
// crc32_combine and Mark Adler's crc32c.c do).
#if defined(__x86_64__) || defined(__aarch64__) || defined(__arm64__)
#define BATON_CRC_STREAM 256
static uint32_t baton_crc_shift[4][256];
/// 0: not built, 1: being built (by one thread), 2: ready.
static int baton_crc_shift_state = 0;

/// Runs the CRC register `r` over `n` zero bytes, a bit at a time (for building the tables).
static uint32_t baton_crc_zeros_slow(uint32_t r, size_t n) {
    for (size_t bit = 0; bit < n * 8; bit++) r = (r & 1) ? (r >> 1) ^ 0x82F63B78u : r >> 1;
    return r;
}

static void baton_crc_init_shift(void) {
    uint32_t basis[32];
    for (int i = 0; i < 32; i++) basis[i] = baton_crc_zeros_slow(1u << i, BATON_CRC_STREAM);
    for (int k = 0; k < 4; k++) {
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t r = 0;
            for (int b = 0; b < 8; b++) if (v & (1u << b)) r ^= basis[8 * k + b];
            baton_crc_shift[k][v] = r;
        }
    }
}

/// Whether the shift table is ready, building it on first use. One thread builds it; another
/// that comes meanwhile runs one chain this time rather than wait.
static int baton_crc_shift_available(void) {
    int state = __atomic_load_n(&baton_crc_shift_state, __ATOMIC_ACQUIRE);
    if (state == 2) return 1;
    if (state == 1 || !__atomic_compare_exchange_n(&baton_crc_shift_state, &state, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        return 0;
    }
    baton_crc_init_shift();
    __atomic_store_n(&baton_crc_shift_state, 2, __ATOMIC_RELEASE);
    return 1;
}

/// shift for BATON_CRC_STREAM zero bytes of the register `r`.
static inline uint32_t baton_crc_shift_stream(uint32_t r) {
    return baton_crc_shift[0][r & 0xff] ^ baton_crc_shift[1][(r >> 8) & 0xff] ^
           baton_crc_shift[2][(r >> 16) & 0xff] ^ baton_crc_shift[3][r >> 24];
}
#endif

// The processor's instructions, one step of 8 bytes and one of a byte each, compiled for the
// feature they need (BATON_CRC_TARGET); the one loop below runs on both.
#if defined(__x86_64__)
#define BATON_CRC32C_HAS_HW 1
#define BATON_CRC_TARGET __attribute__((target("sse4.2")))
BATON_CRC_TARGET static inline uint32_t baton_crc_step8(uint32_t c, uint64_t word) {
    return (uint32_t)__builtin_ia32_crc32di(c, word);
}
BATON_CRC_TARGET static inline uint32_t baton_crc_step1(uint32_t c, uint8_t byte) {
    return __builtin_ia32_crc32qi(c, byte);
}

static int baton_crc32c_hw_available(void) { return __builtin_cpu_supports("sse4.2"); }
#elif defined(__aarch64__) || defined(__arm64__)
#define BATON_CRC32C_HAS_HW 1
// CRC32CX and CRC32CB (the ARM ARM's CRC32C instructions, clang's __builtin_arm_crc32cd and
// __builtin_arm_crc32cb): the same polynomial, reflected, as SSE4.2's CRC32. A little-endian
// load of 8 bytes feeds them in memory order.
#define BATON_CRC_TARGET __attribute__((target("crc")))
BATON_CRC_TARGET static inline uint32_t baton_crc_step8(uint32_t c, uint64_t word) {
    return __builtin_arm_crc32cd(c, word);
}
BATON_CRC_TARGET static inline uint32_t baton_crc_step1(uint32_t c, uint8_t byte) {
    return __builtin_arm_crc32cb(c, byte);
}

static int baton_crc32c_hw_available(void) { return baton_cpu_has_crc32(); }
#endif

#if defined(BATON_CRC32C_HAS_HW)
BATON_CRC_TARGET
static uint32_t baton_crc32c_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t c = ~crc;
    if (n >= 3 * BATON_CRC_STREAM && baton_crc_shift_available()) {
        do {
            uint32_t c1 = 0, c2 = 0;
            for (size_t i = 0; i < BATON_CRC_STREAM; i += 8) {
                uint64_t w0, w1, w2;
                __builtin_memcpy(&w0, p + i, 8);
                __builtin_memcpy(&w1, p + BATON_CRC_STREAM + i, 8);
                __builtin_memcpy(&w2, p + 2 * BATON_CRC_STREAM + i, 8);
                c = baton_crc_step8(c, w0);
                c1 = baton_crc_step8(c1, w1);
                c2 = baton_crc_step8(c2, w2);
            }
            c = baton_crc_shift_stream(c) ^ c1;
            c = baton_crc_shift_stream(c) ^ c2;
            p += 3 * BATON_CRC_STREAM;
            n -= 3 * BATON_CRC_STREAM;
        } while (n >= 3 * BATON_CRC_STREAM);
    }
    while (n >= 8) {
        uint64_t word;
        __builtin_memcpy(&word, p, 8);
        c = baton_crc_step8(c, word);
        p += 8;
        n -= 8;
    }
    while (n--) c = baton_crc_step1(c, *p++);
    return ~c;
}
#endif

#if defined(BATON_CRC32C_HAS_HW)
uint32_t baton_crc32c(uint32_t crc, const void *data, size_t length) {
    // -1 unknown, 0 the table, 1 the instructions (a race asks twice and finds the same).
    static int has_hw = -1;
    int hw = __atomic_load_n(&has_hw, __ATOMIC_RELAXED);
    if (hw < 0) {
        hw = baton_crc32c_hw_available() ? 1 : 0;
        __atomic_store_n(&has_hw, hw, __ATOMIC_RELAXED);
    }
    return hw ? baton_crc32c_hw(crc, (const uint8_t *)data, length)
              : baton_crc32c_sw(crc, (const uint8_t *)data, length);
}
#else
uint32_t baton_crc32c(uint32_t crc, const void *data, size_t length) {
    return baton_crc32c_sw(crc, (const uint8_t *)data, length);
}
#endif

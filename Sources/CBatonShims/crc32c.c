// CRC-32C (Castagnoli): hardware instructions on x86-64 with SSE4.2 and on ARMv8 with CRC,
// a table-driven fallback elsewhere.
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

#if defined(__x86_64__)
__attribute__((target("sse4.2")))
static uint32_t baton_crc32c_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = ~crc;
    while (n >= 8) {
        uint64_t word;
        __builtin_memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}

uint32_t baton_crc32c(uint32_t crc, const void *data, size_t length) {
    static int has_sse42 = -1;
    if (has_sse42 < 0) has_sse42 = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    return has_sse42 ? baton_crc32c_hw(crc, (const uint8_t *)data, length)
                     : baton_crc32c_sw(crc, (const uint8_t *)data, length);
}
#else
uint32_t baton_crc32c(uint32_t crc, const void *data, size_t length) {
    return baton_crc32c_sw(crc, (const uint8_t *)data, length);
}
#endif

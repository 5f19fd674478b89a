// Checks baton_crc32c (Sources/CBatonShims/crc32c.c) on the processor it runs on: known values,
// the instructions' path against the table's on every length and alignment, continuation, and
// that the path the library takes is the one the processor offers. Built and run by
// scripts/check-crc32c.sh, natively and for aarch64 under qemu.
//
//   crc32c-test [--expect-hw|--expect-sw] [--time]
#include "../../Sources/CBatonShims/crc32c.c"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int failures = 0;

static void expect(uint32_t got, uint32_t want, const char *what) {
    if (got != want) {
        printf("FAIL %s: 0x%08x, expected 0x%08x\n", what, got, want);
        failures++;
    }
}

// The first long inputs, from several threads at once: one builds the streams' shift table,
// the others run one chain meanwhile; every result must be right.
static uint8_t racing[3000];
static uint32_t racing_expected;
static int racing_wrong = 0;

static void *race(void *unused) {
    (void)unused;
    for (int i = 0; i < 200; i++) {
        if (baton_crc32c(0, racing, sizeof racing) != racing_expected) __atomic_store_n(&racing_wrong, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    int expect_hw = -1, timing = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--expect-hw") == 0) expect_hw = 1;
        else if (strcmp(argv[i], "--expect-sw") == 0) expect_hw = 0;
        else if (strcmp(argv[i], "--time") == 0) timing = 1;
        else { fprintf(stderr, "usage: %s [--expect-hw|--expect-sw] [--time]\n", argv[0]); return 2; }
    }
#if defined(BATON_CRC32C_HAS_HW)
    int hw = baton_crc32c_hw_available() ? 1 : 0;
#else
    int hw = 0;
#endif
    printf("path: %s\n", hw ? "instructions" : "table");

    for (size_t i = 0; i < sizeof racing; i++) racing[i] = (uint8_t)(i * 131 + 7);
    racing_expected = baton_crc32c_sw(0, racing, sizeof racing);
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) pthread_create(&threads[i], NULL, race, NULL);
    for (int i = 0; i < 4; i++) pthread_join(threads[i], NULL);
    if (racing_wrong) {
        printf("FAIL a CRC computed while another thread built the shift table was wrong\n");
        failures++;
    }
    if (expect_hw >= 0 && hw != expect_hw) {
        printf("FAIL the processor %s the CRC-32C instructions, expected the opposite\n", hw ? "offers" : "does not offer");
        failures++;
    }

    // Known values: "123456789" (the check value of CRC-32C), and RFC 3720 B.4's 32-byte
    // patterns (zeros, ones, incrementing, decrementing).
    uint8_t block[32];
    expect(baton_crc32c(0, "123456789", 9), 0xE3069283u, "check value");
    memset(block, 0, 32);
    expect(baton_crc32c(0, block, 32), 0x8A9136AAu, "32 zero bytes");
    memset(block, 0xFF, 32);
    expect(baton_crc32c(0, block, 32), 0x62A8AB43u, "32 0xFF bytes");
    for (int i = 0; i < 32; i++) block[i] = (uint8_t)i;
    expect(baton_crc32c(0, block, 32), 0x46DD794Eu, "32 incrementing bytes");
    for (int i = 0; i < 32; i++) block[i] = (uint8_t)(31 - i);
    expect(baton_crc32c(0, block, 32), 0x113FDB5Cu, "32 decrementing bytes");
    expect(baton_crc32c(0, "", 0), 0, "empty");

    // Every length up to 1,600 and every 13th up to 5,000, at every alignment of 8, pseudo-random
    // bytes: the two paths agree, and a value continued over a split equals the whole. (The
    // instructions' path runs three interleaved streams from 768 bytes on: lengths around each
    // multiple of 768 take every combination of streams and tail.)
    static uint8_t data[5000 + 8];
    uint64_t state = 0x9E3779B97F4A7C15u;
    for (size_t i = 0; i < sizeof data; i++) {
        state ^= state << 13; state ^= state >> 7; state ^= state << 17;
        data[i] = (uint8_t)state;
    }
    char what[96];
    for (size_t offset = 0; offset < 8; offset++) {
        for (size_t length = 0; length <= 5000; length += length < 1600 ? 1 : 13) {
            const uint8_t *p = data + offset;
            uint32_t table = baton_crc32c_sw(0, p, length);
            snprintf(what, sizeof what, "%zu bytes at offset %zu", length, offset);
#if defined(BATON_CRC32C_HAS_HW)
            if (hw) expect(baton_crc32c_hw(0, p, length), table, what);
#endif
            expect(baton_crc32c(0, p, length), table, what);
            size_t split = length / 3;
            snprintf(what, sizeof what, "%zu bytes at offset %zu, continued after %zu", length, offset, split);
            expect(baton_crc32c(baton_crc32c(0, p, split), p + split, length - split), table, what);
            expect(baton_crc32c_sw(baton_crc32c_sw(0, p, split), p + split, length - split), table, what);
        }
    }
    expect(baton_crc32c(0, data, 4096), baton_crc32c_sw(0, data, 4096), "4096 bytes");
    // Zeros and ones across the streams' joins.
    static uint8_t same[2304];
    memset(same, 0, sizeof same);
    expect(baton_crc32c(0, same, sizeof same), baton_crc32c_sw(0, same, sizeof same), "2304 zero bytes");
    memset(same, 0xFF, sizeof same);
    expect(baton_crc32c(0, same, sizeof same), baton_crc32c_sw(0, same, sizeof same), "2304 0xFF bytes");

    if (timing) {
        // A role record read checks two slots of 2560 bytes.
        for (int pass = 0; pass < 2; pass++) {
            const char *name = pass == 0 ? "table" : "instructions";
            if (pass == 1 && !hw) break;
            uint32_t sink = 0;
            uint64_t start = now_ns();
            for (int i = 0; i < 200000; i++) {
#if defined(BATON_CRC32C_HAS_HW)
                sink ^= pass == 0 ? baton_crc32c_sw(sink, data, 2560) : baton_crc32c_hw(sink, data, 2560);
#else
                sink ^= baton_crc32c_sw(sink, data, 2560);
#endif
            }
            printf("2560 bytes, %s: %.0f ns (%08x)\n", name, (double)(now_ns() - start) / 200000, sink);
            if (pass == 1) {
                // The same bytes as one chain of instructions (the path before the streams).
                uint64_t serial = now_ns();
                for (int i = 0; i < 200000; i++) {
                    for (int part = 0; part < 10; part++) sink ^= baton_crc32c_hw(sink, data + 256 * part, 256);
                }
                printf("2560 bytes, instructions in one chain (10 calls of 256 bytes): %.0f ns (%08x)\n", (double)(now_ns() - serial) / 200000, sink);
            }
        }
    }
    if (failures) { printf("%d failures\n", failures); return 1; }
    printf("ok\n");
    return 0;
}

/*
 * fcoe-spoof: send FCoE frames whose source MAC does not belong to the
 * FC_ID they carry, from inside the kernel-peer guest
 * (crates/gateway/tests/kernel_fcoe.rs). An FCF must drop every one.
 *
 *   fcoe-spoof IFACE FCF_MAC SRC_MAC S_ID D_ID COUNT
 *
 * Each frame is an ELS ECHO from S_ID to D_ID with a correct FC CRC, so the
 * only thing wrong with it is the pairing of source MAC and S_ID. Built
 * statically on the host by the test (the guest has no compiler).
 */
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int parse_mac(const char *s, uint8_t mac[6])
{
    unsigned v[6];
    if (sscanf(s, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6)
        return -1;
    for (int i = 0; i < 6; i++)
        mac[i] = (uint8_t)v[i];
    return 0;
}

/* CRC-32 (IEEE 802.3), as FC-FS computes it over header and payload. */
static uint32_t crc32(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: %s IFACE FCF_MAC SRC_MAC S_ID D_ID COUNT\n", argv[0]);
        return 2;
    }
    uint8_t dst[6], src[6];
    if (parse_mac(argv[2], dst) || parse_mac(argv[3], src)) {
        fprintf(stderr, "bad MAC\n");
        return 2;
    }
    uint32_t s_id = (uint32_t)strtoul(argv[4], NULL, 16);
    uint32_t d_id = (uint32_t)strtoul(argv[5], NULL, 16);
    int count = atoi(argv[6]);
    int ifindex = (int)if_nametoindex(argv[1]);
    if (ifindex == 0) {
        perror("if_nametoindex");
        return 1;
    }
    int fd = socket(AF_PACKET, SOCK_RAW, htons(0x8906));
    if (fd < 0) {
        perror("socket");
        return 1;
    }
    uint8_t f[128];
    size_t n = 0;
    memcpy(f, dst, 6);
    memcpy(f + 6, src, 6);
    f[12] = 0x89;
    f[13] = 0x06;
    n = 14;
    memset(f + n, 0, 13); /* FCoE version 0, reserved */
    f[n + 13] = 0x2e;     /* SOFi3 */
    n += 14;
    uint8_t *fc = f + n;
    uint8_t hdr[24] = {
        0x22, (uint8_t)(d_id >> 16), (uint8_t)(d_id >> 8), (uint8_t)d_id, /* R_CTL ELS request, D_ID */
        0x00, (uint8_t)(s_id >> 16), (uint8_t)(s_id >> 8), (uint8_t)s_id, /* CS_CTL, S_ID */
        0x01, 0x29, 0x00, 0x00,                                           /* TYPE ELS, F_CTL */
        0x00, 0x00, 0x00, 0x00,                                           /* SEQ_ID, DF_CTL, SEQ_CNT */
        0x12, 0x34, 0xff, 0xff,                                           /* OX_ID, RX_ID */
        0x00, 0x00, 0x00, 0x00,                                           /* parameter */
    };
    memcpy(fc, hdr, sizeof hdr);
    uint8_t echo[8] = {0x10, 0, 0, 0, 'u', 'n', 'f', 'b'};
    memcpy(fc + 24, echo, sizeof echo);
    uint32_t crc = crc32(fc, 32);
    n += 32;
    f[n++] = (uint8_t)crc; /* FCoE carries the CRC least significant byte first */
    f[n++] = (uint8_t)(crc >> 8);
    f[n++] = (uint8_t)(crc >> 16);
    f[n++] = (uint8_t)(crc >> 24);
    f[n++] = 0x42; /* EOFt */
    f[n++] = 0;
    f[n++] = 0;
    f[n++] = 0;
    struct sockaddr_ll to = {0};
    to.sll_family = AF_PACKET;
    to.sll_ifindex = ifindex;
    to.sll_halen = 6;
    memcpy(to.sll_addr, dst, 6);
    for (int i = 0; i < count; i++) {
        if (sendto(fd, f, n, 0, (struct sockaddr *)&to, sizeof to) != (ssize_t)n) {
            perror("sendto");
            return 1;
        }
    }
    printf("sent %d spoofed FCoE frames (src %s, S_ID %06x) on %s\n", count, argv[3], s_id, argv[1]);
    return 0;
}

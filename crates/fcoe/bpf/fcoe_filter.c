// SPDX-License-Identifier: MIT OR Apache-2.0
//
// unifab's XDP filter for FCoE ports: frames whose EtherType is FCoE
// (0x8906) or FIP (0x8914), untagged or behind one 802.1Q tag, go to the
// AF_XDP socket bound to the receiving queue (xsks_map[rx_queue_index]);
// everything else — and FCoE/FIP on a queue with no socket — passes to the
// kernel's stack, so the interface stays usable for IP.
//
// Built by build.rs with `clang -O2 -g -target bpf` (the -g gives the BTF
// that describes the map). Self-contained on purpose: it needs only the
// kernel's UAPI headers (Debian linux-libc-dev), not libbpf's.

#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) __typeof__(val) *name

// bpf_redirect_map is helper number 51 (include/uapi/linux/bpf.h).
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)51;

struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, 64);
    __type(key, __u32);
    __type(value, __u32);
} xsks_map SEC(".maps");

SEC("xdp")
int fcoe_filter(struct xdp_md *ctx)
{
    unsigned char *p = (unsigned char *)(long)ctx->data;
    unsigned char *end = (unsigned char *)(long)ctx->data_end;

    if (p + 14 > end)
        return XDP_PASS;
    __u16 type = ((__u16)p[12] << 8) | p[13];
    if (type == 0x8100) {
        if (p + 18 > end)
            return XDP_PASS;
        type = ((__u16)p[16] << 8) | p[17];
    }
    if (type != 0x8906 && type != 0x8914)
        return XDP_PASS;
    // The low bits of flags are the action when the queue has no socket.
    return bpf_redirect_map(&xsks_map, ctx->rx_queue_index, XDP_PASS);
}

char _license[] SEC("license") = "Dual MIT/GPL";

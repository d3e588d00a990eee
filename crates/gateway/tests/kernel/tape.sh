# shellcheck shell=sh
# shellcheck disable=SC2154 # SHARE: set by common.sh, which comes first
# Linux's SCSI tape driver (st, mt-st) against unifab's tape LU over
# open-iscsi (crates/gateway/tests/kernel_tape.rs): status, rewind, three
# tar archives separated by filemarks, spacing, reading back identical.
start_iscsid
modprobe st
make_node
login
i=0
while [ ! -c /dev/nst0 ] && [ $i -lt 300 ]; do
    sleep 0.2
    i=$((i + 1))
done
[ -c /dev/nst0 ] || fail "no /dev/nst0 within 60 s"
ok "the tape LU is st0"
T=/dev/nst0

mt -f $T status | tee "$SHARE/mt-status.txt"
mt -f $T rewind
mt -f $T setblk 0
ok "mt status, rewind, variable block mode"

# Three trees, one archive each, 64 KiB records; st writes a filemark
# when the device is closed after writing.
n=1
while [ $n -le 3 ]; do
    i=0
    while [ $i -lt 12 ]; do
        mkdir -p "/tmp/src/t$n/d$((i % 3))"
        head -c $((n * 50000 + i * 4099 + 1)) /dev/urandom >"/tmp/src/t$n/d$((i % 3))/f$i"
        i=$((i + 1))
    done
    tar -cf $T -b 128 -C /tmp/src "t$n" || fail "tar to the tape (archive $n)"
    n=$((n + 1))
done
mt -f $T status | tee "$SHARE/mt-after-write.txt"
ok "three archives written with filemarks"

# Space forward over two filemarks and read the third archive.
mt -f $T rewind
mt -f $T fsf 2
mkdir -p /tmp/back3
tar -xf $T -b 128 -C /tmp/back3 || fail "reading the third archive"
diff -r /tmp/src/t3 /tmp/back3/t3 || fail "the third archive differs"
ok "fsf 2 reads the third archive identical"

# From the start: the first, then the second. tar stops at the archive's
# end, before the filemark, and st (BSD semantics, its default) leaves the
# tape there on close: fsf 1 steps over the filemark.
mt -f $T rewind
mkdir -p /tmp/back1 /tmp/back2
tar -xf $T -b 128 -C /tmp/back1 || fail "reading the first archive"
mt -f $T fsf 1
mt -f $T status | tee "$SHARE/mt-after-first.txt"
tar -xf $T -b 128 -C /tmp/back2 || fail "reading the second archive"
diff -r /tmp/src/t1 /tmp/back1/t1 || fail "the first archive differs"
diff -r /tmp/src/t2 /tmp/back2/t2 || fail "the second archive differs"
ok "rewind, the first and second archives read back identical"

# Back over a filemark, end of data, position.
mt -f $T eod
mt -f $T tell | tee "$SHARE/mt-eod.txt"
mt -f $T bsf 1
mt -f $T status | tee "$SHARE/mt-bsf.txt"
mt -f $T rewind
mt -f $T status | tee "$SHARE/mt-rewound.txt"
ok "eod, bsf, tell"
logout
dmesg | grep -E ' st[0-9]|st0' >"$SHARE/st-dmesg.txt" || true
no_io_errors

//! The part of librados' and librbd's C API the RBD backend uses, declared
//! by hand against `rados/librados.h` and `rbd/librbd.h` (Ceph 16).
//!
//! Written by hand, not generated: bindgen would need libclang at build
//! time for some twenty functions, and the existing `-sys` crates on
//! crates.io pin other Ceph versions or are unmaintained. Every type here
//! is an opaque pointer or a C scalar; none of the structs the header
//! defines is used.

use std::ffi::{c_char, c_int, c_void};

pub type RadosT = *mut c_void;
pub type RadosIoctxT = *mut c_void;
pub type RbdImageT = *mut c_void;
pub type RbdCompletionT = *mut c_void;
pub type RbdCallbackT = Option<unsafe extern "C" fn(cb: RbdCompletionT, arg: *mut c_void)>;
pub type RbdUpdateCallbackT = Option<unsafe extern "C" fn(arg: *mut c_void)>;
pub type DiffCallbackT =
    Option<unsafe extern "C" fn(off: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int>;

/// `RBD_LOCK_MODE_EXCLUSIVE`.
pub const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;
/// No `LIBRADOS_OP_FLAG_*` hints.
pub const OP_FLAG_NONE: c_int = 0;

unsafe extern "C" {
    pub fn rados_create2(
        cluster: *mut RadosT,
        clustername: *const c_char,
        name: *const c_char,
        flags: u64,
    ) -> c_int;
    pub fn rados_conf_read_file(cluster: RadosT, path: *const c_char) -> c_int;
    pub fn rados_conf_set(cluster: RadosT, option: *const c_char, value: *const c_char) -> c_int;
    pub fn rados_conf_get(
        cluster: RadosT,
        option: *const c_char,
        buf: *mut c_char,
        len: usize,
    ) -> c_int;
    pub fn rados_connect(cluster: RadosT) -> c_int;
    pub fn rados_shutdown(cluster: RadosT);
    pub fn rados_mon_command(
        cluster: RadosT,
        cmd: *const *const c_char,
        cmdlen: usize,
        inbuf: *const c_char,
        inbuflen: usize,
        outbuf: *mut *mut c_char,
        outbuflen: *mut usize,
        outs: *mut *mut c_char,
        outslen: *mut usize,
    ) -> c_int;
    pub fn rados_buffer_free(buf: *mut c_char);
    pub fn rados_wait_for_latest_osdmap(cluster: RadosT) -> c_int;
    pub fn rados_getaddrs(cluster: RadosT, addrs: *mut *mut c_char) -> c_int;
    pub fn rados_blocklist_add(
        cluster: RadosT,
        client_address: *mut c_char,
        expire_seconds: u32,
    ) -> c_int;
    pub fn rados_ioctx_create(
        cluster: RadosT,
        pool_name: *const c_char,
        ioctx: *mut RadosIoctxT,
    ) -> c_int;
    pub fn rados_ioctx_destroy(io: RadosIoctxT);

    pub fn rbd_create(io: RadosIoctxT, name: *const c_char, size: u64, order: *mut c_int) -> c_int;
    pub fn rbd_open(
        io: RadosIoctxT,
        name: *const c_char,
        image: *mut RbdImageT,
        snap_name: *const c_char,
    ) -> c_int;
    pub fn rbd_close(image: RbdImageT) -> c_int;
    pub fn rbd_get_size(image: RbdImageT, size: *mut u64) -> c_int;
    pub fn rbd_resize(image: RbdImageT, size: u64) -> c_int;
    pub fn rbd_read2(
        image: RbdImageT,
        ofs: u64,
        len: usize,
        buf: *mut c_char,
        op_flags: c_int,
    ) -> isize;
    pub fn rbd_write2(
        image: RbdImageT,
        ofs: u64,
        len: usize,
        buf: *const c_char,
        op_flags: c_int,
    ) -> isize;
    pub fn rbd_discard(image: RbdImageT, ofs: u64, len: u64) -> c_int;
    pub fn rbd_write_zeroes(
        image: RbdImageT,
        ofs: u64,
        len: usize,
        zero_flags: c_int,
        op_flags: c_int,
    ) -> isize;
    pub fn rbd_flush(image: RbdImageT) -> c_int;
    pub fn rbd_diff_iterate2(
        image: RbdImageT,
        fromsnapname: *const c_char,
        ofs: u64,
        len: u64,
        include_parent: u8,
        whole_object: u8,
        cb: DiffCallbackT,
        arg: *mut c_void,
    ) -> c_int;
    pub fn rbd_update_watch(
        image: RbdImageT,
        handle: *mut u64,
        watch_cb: RbdUpdateCallbackT,
        arg: *mut c_void,
    ) -> c_int;
    pub fn rbd_update_unwatch(image: RbdImageT, handle: u64) -> c_int;
    pub fn rbd_lock_acquire(image: RbdImageT, lock_mode: c_int) -> c_int;
    pub fn rbd_is_exclusive_lock_owner(image: RbdImageT, is_owner: *mut c_int) -> c_int;

    pub fn rbd_aio_create_completion(
        cb_arg: *mut c_void,
        complete_cb: RbdCallbackT,
        c: *mut RbdCompletionT,
    ) -> c_int;
    pub fn rbd_aio_get_return_value(c: RbdCompletionT) -> isize;
    pub fn rbd_aio_release(c: RbdCompletionT);
    pub fn rbd_aio_read2(
        image: RbdImageT,
        off: u64,
        len: usize,
        buf: *mut c_char,
        c: RbdCompletionT,
        op_flags: c_int,
    ) -> c_int;
    pub fn rbd_aio_writev(
        image: RbdImageT,
        iov: *const libc::iovec,
        iovcnt: c_int,
        off: u64,
        c: RbdCompletionT,
    ) -> c_int;
    pub fn rbd_aio_flush(image: RbdImageT, c: RbdCompletionT) -> c_int;
    pub fn rbd_aio_discard(image: RbdImageT, off: u64, len: u64, c: RbdCompletionT) -> c_int;
    pub fn rbd_aio_writesame(
        image: RbdImageT,
        off: u64,
        len: usize,
        buf: *const c_char,
        data_len: usize,
        c: RbdCompletionT,
        op_flags: c_int,
    ) -> c_int;
    pub fn rbd_aio_compare_and_write(
        image: RbdImageT,
        off: u64,
        len: usize,
        cmp_buf: *const c_char,
        buf: *const c_char,
        c: RbdCompletionT,
        mismatch_off: *mut u64,
        op_flags: c_int,
    ) -> isize;
}

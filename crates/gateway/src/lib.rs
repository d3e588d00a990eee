//! The unifab gateway: configuration, wiring of front ends, logical units
//! and the operator interface. The `unifab` binary is a thin shell over it.
//! Capture reading and the pcap round-trip checker live in `unifab-capture`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod plane;
pub mod reload;
pub mod run;
pub mod tuning;

/// Prints a line of a command's result on standard output. A reader that
/// has gone (`unifab pcap-check FILE | head -2`) ends the process quietly
/// with status 0, as `head` expects, instead of a panic; another write
/// error ends it with status 1 and the reason.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::write_out(::std::format_args!($($arg)*), true)
    };
}

/// [`outln!`] without the line end.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_out(::std::format_args!($($arg)*), false)
    };
}

/// Prints a line the running gateway tells whoever started it (the portals
/// it serves). Standard output may be closed or gone: the gateway goes on.
#[macro_export]
macro_rules! notice {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stdout().lock(), $($arg)*);
    }};
}

#[doc(hidden)]
pub fn write_out(args: std::fmt::Arguments<'_>, newline: bool) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let r = if newline {
        writeln!(out, "{args}")
    } else {
        write!(out, "{args}")
    }
    .and_then(|()| out.flush());
    match r {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("unifab: cannot write to standard output: {e}");
            std::process::exit(1);
        }
    }
}

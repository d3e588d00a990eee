//! Free loopback ports and waiting for a listener.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use super::PeerError;

/// A TCP port on 127.0.0.1 that was free a moment ago.
///
/// The kernel picks it (bind to port 0) and the socket is closed again, so
/// another process may take it before the caller binds it: launchers that use
/// this retry with a new port when their daemon reports the port taken.
///
/// # Errors
/// [`PeerError::Io`] if no socket can be bound at all.
pub fn free_tcp_port() -> Result<u16, PeerError> {
    let [port] = free_tcp_ports::<1>()?;
    Ok(port)
}

/// `N` distinct TCP ports on 127.0.0.1 that were free a moment ago.
///
/// All `N` probe sockets stay open until every port is picked, so the
/// ports differ: [`free_tcp_port`] twice in a row can return the same
/// port, and a daemon given both then collides with itself. As with
/// [`free_tcp_port`], another process may take a port before the caller
/// binds it.
///
/// # Errors
/// [`PeerError::Io`] if the sockets cannot be bound.
pub fn free_tcp_ports<const N: usize>() -> Result<[u16; N], PeerError> {
    let mut open = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    for port in &mut ports {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| PeerError::io("binding 127.0.0.1:0 to find a free port", e))?;
        *port = listener
            .local_addr()
            .map_err(|e| PeerError::io("reading the bound port", e))?
            .port();
        open.push(listener);
    }
    Ok(ports)
}

/// Waits until something accepts TCP connections on `addr`, polling every
/// 20 ms, for at most `timeout`. The probe connection is closed at once.
///
/// # Errors
/// [`PeerError::PortTimeout`] if nothing accepted in time.
pub fn wait_for_port(addr: SocketAddr, timeout: Duration) -> Result<(), PeerError> {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(PeerError::PortTimeout {
                addr,
                waited: timeout,
            });
        }
        thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[test]
    fn ports_picked_together_differ() {
        for _ in 0..200 {
            let ports = free_tcp_ports::<4>().expect("four free ports");
            let mut sorted = ports.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), 4, "{ports:?}");
            assert!(ports.iter().all(|p| *p != 0), "{ports:?}");
        }
    }

    #[test]
    fn free_port_can_be_bound() {
        let port = free_tcp_port().expect("free port");
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("port was free");
    }

    #[test]
    fn waits_for_a_listener() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let addr = listener.local_addr().expect("addr");
        wait_for_port(addr, Duration::from_secs(5)).expect("listener is there");
    }

    #[test]
    fn times_out_without_a_listener() {
        let port = free_tcp_port().expect("free port");
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let err = wait_for_port(addr, Duration::from_millis(100)).expect_err("nothing listens");
        assert!(matches!(err, PeerError::PortTimeout { addr: a, .. } if a == addr));
    }
}

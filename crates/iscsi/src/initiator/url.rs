//! iSCSI addresses in the form libiscsi and QEMU use:
//!
//! ```text
//! iscsi://[user[%secret]@]host[:port]/target-iqn/lun[?target_user=U&target_password=S]
//! ```
//!
//! `user%secret` are the initiator's CHAP credentials; `target_user` and
//! `target_password` the target's, for mutual CHAP. `host` may be an IPv6
//! address in brackets. The port defaults to 3260. The LUN is an index
//! (peripheral or flat addressing, as [`Lun::from_index`] encodes it).
//!
//! ```
//! use unifab_iscsi::initiator::IscsiUrl;
//! let u: IscsiUrl = "iscsi://alice%secret-12345@192.0.2.7/iqn.2001-04.com.example:disk/1"
//!     .parse()?;
//! assert_eq!(u.portal(), "192.0.2.7:3260");
//! assert_eq!(u.target.as_deref(), Some("iqn.2001-04.com.example:disk"));
//! assert_eq!(u.lun, Some(1));
//! // Display never shows secrets.
//! assert_eq!(u.to_string(), "iscsi://alice@192.0.2.7:3260/iqn.2001-04.com.example:disk/1");
//! # Ok::<(), unifab_iscsi::initiator::UrlError>(())
//! ```

use std::fmt;
use std::str::FromStr;

use unifab_scsi_core::Lun;

/// A parsed `iscsi://` address.
#[derive(Clone, PartialEq, Eq)]
pub struct IscsiUrl {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Target name; `None` for a portal-only address (discovery).
    pub target: Option<String>,
    /// LUN index; `None` when absent.
    pub lun: Option<u16>,
    /// The initiator's CHAP name and secret.
    pub chap: Option<(String, String)>,
    /// The target's CHAP name and secret (mutual CHAP).
    pub mutual_chap: Option<(String, String)>,
}

impl fmt::Debug for IscsiUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IscsiUrl({self})")
    }
}

/// Why an address does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// It does not start with `iscsi://`.
    #[error("an iSCSI address starts with iscsi://")]
    Scheme,
    /// No host.
    #[error("missing host")]
    Host,
    /// The port is not a number in 1..=65535.
    #[error("invalid port {0:?}")]
    Port(String),
    /// The LUN is not an index below 16384.
    #[error("invalid LUN {0:?}")]
    Lun(String),
    /// The target name is missing or not an iSCSI name.
    #[error("invalid target name {0:?}")]
    Target(String),
    /// An unknown or malformed query parameter.
    #[error("invalid parameter {0:?} (known: target_user, target_password)")]
    Query(String),
    /// Something follows the LUN.
    #[error("unexpected {0:?} after the LUN")]
    Trailing(String),
}

impl IscsiUrl {
    /// `host:port`, with brackets around an IPv6 address.
    pub fn portal(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The LUN in its 8-byte form (`None` without one).
    pub fn lun(&self) -> Option<Lun> {
        self.lun.and_then(Lun::from_index)
    }

    /// The address without any credentials, as logs and `unifab show`
    /// print it.
    pub fn redacted(&self) -> String {
        let mut s = format!("iscsi://{}", self.portal());
        if let Some(t) = &self.target {
            s.push('/');
            s.push_str(t);
            if let Some(l) = self.lun {
                s.push_str(&format!("/{l}"));
            }
        }
        s
    }
}

impl fmt::Display for IscsiUrl {
    /// The address with the CHAP user but never a secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("iscsi://")?;
        if let Some((u, _)) = &self.chap {
            write!(f, "{u}@")?;
        }
        let r = self.redacted();
        f.write_str(r.strip_prefix("iscsi://").unwrap_or(&r))
    }
}

impl FromStr for IscsiUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<IscsiUrl, UrlError> {
        let rest = s
            .strip_prefix("iscsi://")
            .or_else(|| s.strip_prefix("ISCSI://"))
            .ok_or(UrlError::Scheme)?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        // Credentials end at the last '@' before the first '/'.
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let (userinfo, rest) = match rest[..authority_end].rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let chap = userinfo.map(|u| match u.split_once('%') {
            Some((n, p)) => (n.to_string(), p.to_string()),
            None => (u.to_string(), String::new()),
        });
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (rest, None),
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or(UrlError::Host)?;
            match after.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None if after.is_empty() => (h, None),
                None => return Err(UrlError::Host),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(UrlError::Host);
        }
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&n| n != 0)
                .ok_or_else(|| UrlError::Port(p.to_string()))?,
            None => 3260,
        };
        let (target, lun) = match path.filter(|p| !p.is_empty()) {
            None => (None, None),
            Some(p) => {
                let mut parts = p.splitn(3, '/');
                let t = parts.next().unwrap_or_default();
                let lower = t.to_ascii_lowercase();
                if !(lower.starts_with("iqn.")
                    || lower.starts_with("eui.")
                    || lower.starts_with("naa."))
                {
                    return Err(UrlError::Target(t.to_string()));
                }
                let lun = match parts.next().filter(|l| !l.is_empty()) {
                    Some(l) => Some(
                        l.parse::<u16>()
                            .ok()
                            .filter(|&n| Lun::from_index(n).is_some())
                            .ok_or_else(|| UrlError::Lun(l.to_string()))?,
                    ),
                    None => None,
                };
                if let Some(extra) = parts.next().filter(|e| !e.is_empty()) {
                    return Err(UrlError::Trailing(extra.to_string()));
                }
                (Some(t.to_string()), lun)
            }
        };
        let mut tu = None;
        let mut tp = None;
        for kv in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|k| !k.is_empty())
        {
            match kv.split_once('=') {
                Some(("target_user", v)) => tu = Some(v.to_string()),
                Some(("target_password", v)) => tp = Some(v.to_string()),
                _ => return Err(UrlError::Query(kv.to_string())),
            }
        }
        let mutual_chap = match (tu, tp) {
            (Some(u), Some(p)) => Some((u, p)),
            (None, None) => None,
            _ => {
                return Err(UrlError::Query(
                    "target_user and target_password go together".into(),
                ));
            }
        };
        Ok(IscsiUrl {
            host: host.to_string(),
            port,
            target,
            lun,
            chap,
            mutual_chap,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        let u: IscsiUrl = "iscsi://127.0.0.1:3261/iqn.2026-11.io.unifab:t/0"
            .parse()
            .unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.lun),
            ("127.0.0.1", 3261, Some(0))
        );
        assert_eq!(u.chap, None);
        assert_eq!(u.lun(), Some(Lun(0)));
        let u: IscsiUrl = "iscsi://u%p@w@host/iqn.2026-11.x:y/300?target_user=t&target_password=s"
            .parse()
            .unwrap();
        assert_eq!(u.chap, Some(("u".into(), "p@w".into())));
        assert_eq!(u.mutual_chap, Some(("t".into(), "s".into())));
        assert_eq!(u.port, 3260);
        assert_eq!(u.lun(), Lun::from_index(300));
        assert!(!u.to_string().contains("p@w"));
        assert_eq!(u.redacted(), "iscsi://host:3260/iqn.2026-11.x:y/300");
        let u: IscsiUrl = "iscsi://[::1]:3262/iqn.2026-11.x:y/1".parse().unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 3262));
        assert_eq!(u.portal(), "[::1]:3262");
        let u: IscsiUrl = "iscsi://example.net".parse().unwrap();
        assert_eq!((u.target, u.lun), (None, None));
    }

    #[test]
    fn errors() {
        for (s, want) in [
            ("http://x/iqn.2026-11.x:y/0", UrlError::Scheme),
            ("iscsi:///iqn.2026-11.x:y/0", UrlError::Host),
            ("iscsi://h:0/iqn.2026-11.x:y/0", UrlError::Port("0".into())),
            (
                "iscsi://h:99999/iqn.2026-11.x:y/0",
                UrlError::Port("99999".into()),
            ),
            ("iscsi://h/notaname/0", UrlError::Target("notaname".into())),
            ("iscsi://h/iqn.2026-11.x:y/x", UrlError::Lun("x".into())),
            (
                "iscsi://h/iqn.2026-11.x:y/20000",
                UrlError::Lun("20000".into()),
            ),
            (
                "iscsi://h/iqn.2026-11.x:y/1/2",
                UrlError::Trailing("2".into()),
            ),
            (
                "iscsi://h/iqn.2026-11.x:y/1?foo=1",
                UrlError::Query("foo=1".into()),
            ),
        ] {
            assert_eq!(s.parse::<IscsiUrl>(), Err(want), "{s}");
        }
    }
}

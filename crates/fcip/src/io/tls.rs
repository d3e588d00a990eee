//! TLS 1.3 on circuits (rustls, ring provider). RFC 3821's IPsec is
//! kernel business and not available to a userspace gateway; between two
//! unifab gateways every circuit can instead run inside TLS 1.3 with
//!
//! - mutual certificates: each side presents its certificate and checks
//!   the other's against the configured CA, or
//! - a pre-shared key: each side presents a throw-away self-signed
//!   certificate, and right after the handshake both prove knowledge of
//!   the key with HMAC-SHA256 over a TLS exporter value (RFC 8446 §7.5)
//!   bound to this very session; a wrong key closes the circuit.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::tunnel::Stream;

/// Why TLS settings could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file did not hold what it should.
    #[error("{0}")]
    Pem(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// A circuit's TLS settings (both roles).
#[derive(Debug)]
pub struct TlsSettings {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    server_name: ServerName<'static>,
    psk: Option<Vec<u8>>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsSettings {
    /// Mutual certificates: our chain and key, the CA that signs the
    /// peer's, and the name the peer's certificate must carry.
    pub fn mutual(
        cert_pem: &[u8],
        key_pem: &[u8],
        ca_pem: &[u8],
        peer_name: &str,
    ) -> Result<TlsSettings, TlsError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| TlsError::Pem(format!("certificate: {e}")))?;
        if certs.is_empty() {
            return Err(TlsError::Pem(
                "no certificate in the certificate file".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| TlsError::Pem(format!("key: {e}")))?;
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem) {
            let c = c.map_err(|e| TlsError::Pem(format!("CA: {e}")))?;
            roots.add(c)?;
        }
        let roots = Arc::new(roots);
        let client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(certs.clone(), key.clone_key())?;
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| TlsError::Pem(format!("client verifier: {e}")))?;
        let server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)?;
        let server_name = ServerName::try_from(peer_name.to_string())
            .map_err(|e| TlsError::Pem(format!("peer name: {e}")))?;
        Ok(TlsSettings {
            client: Arc::new(client),
            server: Arc::new(server),
            server_name,
            psk: None,
        })
    }

    /// A pre-shared key (at least 16 bytes).
    pub fn pre_shared_key(psk: &[u8]) -> Result<TlsSettings, TlsError> {
        if psk.len() < 16 {
            return Err(TlsError::Pem(
                "the pre-shared key must have at least 16 bytes".into(),
            ));
        }
        let ck = rcgen::generate_simple_self_signed(vec!["unifab-fcip".to_string()])
            .map_err(|e| TlsError::Pem(format!("self-signed certificate: {e}")))?;
        let cert = CertificateDer::from(ck.cert.der().to_vec());
        let key = PrivateKeyDer::try_from(ck.key_pair.serialize_der())
            .map_err(|e| TlsError::Pem(e.to_string()))?;
        let any = Arc::new(AnyCert(provider()));
        let client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(any.clone())
            .with_client_auth_cert(vec![cert.clone()], key.clone_key())?;
        let server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(any)
            .with_single_cert(vec![cert], key)?;
        Ok(TlsSettings {
            client: Arc::new(client),
            server: Arc::new(server),
            server_name: ServerName::try_from("unifab-fcip")
                .map_err(|e| TlsError::Pem(e.to_string()))?,
            psk: Some(psk.to_vec()),
        })
    }

    /// The connecting side.
    pub async fn connect(&self, tcp: TcpStream) -> Result<Box<dyn Stream>, String> {
        let mut s = TlsConnector::from(self.client.clone())
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        if let Some(psk) = &self.psk {
            let ex = exporter(s.get_ref().1.export_keying_material(
                [0u8; 32],
                b"EXPORTER-unifab-fcip-psk",
                None,
            ))?;
            prove(&mut s, psk, &ex, b"connector", b"acceptor").await?;
        }
        Ok(Box::new(s))
    }

    /// The accepting side.
    pub async fn accept(&self, tcp: TcpStream) -> Result<Box<dyn Stream>, String> {
        let mut s = TlsAcceptor::from(self.server.clone())
            .accept(tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        if let Some(psk) = &self.psk {
            let ex = exporter(s.get_ref().1.export_keying_material(
                [0u8; 32],
                b"EXPORTER-unifab-fcip-psk",
                None,
            ))?;
            prove(&mut s, psk, &ex, b"acceptor", b"connector").await?;
        }
        Ok(Box::new(s))
    }
}

fn exporter(r: Result<[u8; 32], rustls::Error>) -> Result<[u8; 32], String> {
    r.map_err(|e| format!("TLS exporter: {e}"))
}

fn mac(psk: &[u8], ex: &[u8; 32], role: &[u8]) -> Vec<u8> {
    use hmac::{KeyInit, Mac};
    let mut m = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(psk).unwrap_or_else(|_| {
        <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&[0u8; 32])
            .unwrap_or_else(|_| unreachable!())
    });
    m.update(role);
    m.update(ex);
    m.finalize().into_bytes().to_vec()
}

async fn prove<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    psk: &[u8],
    ex: &[u8; 32],
    me: &[u8],
    them: &[u8],
) -> Result<(), String> {
    s.write_all(&mac(psk, ex, me))
        .await
        .map_err(|e| e.to_string())?;
    s.flush().await.map_err(|e| e.to_string())?;
    let mut got = [0u8; 32];
    tokio::time::timeout(std::time::Duration::from_secs(10), s.read_exact(&mut got))
        .await
        .map_err(|_| "pre-shared key proof timed out".to_string())?
        .map_err(|e| format!("pre-shared key proof: {e}"))?;
    let want = mac(psk, ex, them);
    // Constant-time compare.
    let diff = want
        .iter()
        .zip(got.iter())
        .fold(0u8, |a, (x, y)| a | (x ^ y));
    if diff != 0 || want.len() != 32 {
        return Err("wrong pre-shared key".into());
    }
    Ok(())
}

/// Accepts any certificate (PSK mode: the key proof authenticates), but
/// still checks the handshake signatures made with it.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl ClientCertVerifier for AnyCert {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

//! TLS for `wss://`: the web PKI roots by default, `--ca FILE` for private roots, or
//! `--pin-sha256` to accept exactly one certificate (a self-signed daemon's, printed by
//! `acpd cert`).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};

/// How the server's certificate is checked.
#[derive(Debug, Clone)]
pub enum Trust {
    WebPki,
    CaFile(std::path::PathBuf),
    Pin([u8; 32]),
}

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("cannot read CA file {path}: {message}")]
    Ca { path: String, message: String },
    #[error("invalid --pin-sha256: expected 64 hex digits (colons allowed)")]
    Pin,
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Parses a SHA-256 fingerprint: 64 hex digits, optionally colon-separated, any case.
pub fn parse_pin(s: &str) -> Result<[u8; 32], TlsSetupError> {
    let hex: String = s.chars().filter(|c| *c != ':').collect();
    if hex.len() != 64 {
        return Err(TlsSetupError::Pin);
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or(TlsSetupError::Pin)?, 16)
            .map_err(|_| TlsSetupError::Pin)?;
    }
    Ok(out)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The client configuration for `trust`.
pub fn client_config(trust: &Trust) -> Result<Arc<ClientConfig>, TlsSetupError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let config = match trust {
        Trust::WebPki => {
            let roots = RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        Trust::CaFile(path) => builder
            .with_root_certificates(read_roots(path)?)
            .with_no_client_auth(),
        Trust::Pin(pin) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinVerifier {
                pin: *pin,
                algs: provider.signature_verification_algorithms,
            }))
            .with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

fn read_roots(path: &Path) -> Result<RootCertStore, TlsSetupError> {
    let err = |message: String| TlsSetupError::Ca {
        path: path.display().to_string(),
        message,
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| err(e.to_string()))? {
        roots
            .add(cert.map_err(|e| err(e.to_string()))?)
            .map_err(|e| err(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(err("no certificate in it".into()));
    }
    Ok(roots)
}

/// Accepts exactly the certificate whose DER SHA-256 is `pin`, whatever its name or issuer;
/// the handshake signatures are still verified against that certificate's key.
#[derive(Debug)]
pub struct PinVerifier {
    pin: [u8; 32],
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got: [u8; 32] = Sha256::digest(end_entity.as_ref()).into();
        if got == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "certificate fingerprint {} does not match --pin-sha256",
                hex(&got)
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_parse_with_or_without_colons() {
        let plain = "00".repeat(31) + "ff";
        let colons = plain
            .as_bytes()
            .chunks(2)
            .map(|c| std::str::from_utf8(c).unwrap().to_uppercase())
            .collect::<Vec<_>>()
            .join(":");
        assert_eq!(parse_pin(&plain).unwrap()[31], 0xff);
        assert_eq!(parse_pin(&colons).unwrap(), parse_pin(&plain).unwrap());
        assert!(parse_pin("abc").is_err());
        assert!(parse_pin(&"zz".repeat(32)).is_err());
    }
}

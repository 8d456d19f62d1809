//! The internal link's TLS client configuration: a peer whose `advertise_url` is `wss://`
//! (or `https://`) is checked against the web PKI roots plus the certificates of
//! `cluster_ca_file` (a private CA, or the replicas' own self-signed certificate), so the
//! cluster secret never travels to an unverified peer.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore};

/// Builds the configuration once, at config validation: a bad CA file is a config error.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let shown = path.display();
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("cannot read {shown}: {e}"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{shown} is not PEM certificates: {e}"))?;
        if certs.is_empty() {
            return Err(format!("{shown} holds no PEM certificate"));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("{shown}: a certificate is unusable as a root: {e}"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Whether the secret would travel in clear to reach this replica: a plain `ws://` or
/// `http://` URL whose host is not loopback.
pub fn clear_and_not_loopback(advertise_url: &str) -> bool {
    let Some((scheme, rest)) = advertise_url.split_once("://") else {
        return false;
    };
    if !matches!(scheme, "ws" | "http") {
        return false;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    !loopback
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_clear_url_off_loopback_is_flagged() {
        assert!(clear_and_not_loopback("ws://acpd-0.acpd:7420"));
        assert!(clear_and_not_loopback("http://10.0.0.5:7420/"));
        assert!(!clear_and_not_loopback("ws://127.0.0.1:7420"));
        assert!(!clear_and_not_loopback("ws://localhost:7420"));
        assert!(!clear_and_not_loopback("ws://[::1]:7420"));
        assert!(!clear_and_not_loopback("wss://acpd-0.acpd:7420"));
        assert!(!clear_and_not_loopback("https://acpd-0.acpd"));
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        assert!(client_config(Some(&path)).is_err());
        assert!(client_config(Some(&dir.path().join("missing.pem"))).is_err());
        assert!(client_config(None).is_ok());
    }
}

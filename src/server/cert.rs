//! `acpd cert`: a self-signed certificate and key for the daemon's TLS listener, and the
//! SHA-256 fingerprint a client pins (`acp-shim --pin-sha256`) instead of trusting a CA.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use chrono::Datelike;
use rcgen::{CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair};
use sha2::{Digest, Sha256};

/// The certificate file `acpd cert` writes in `--out-dir`.
pub const CERT_FILE: &str = "cert.pem";
/// The private key file `acpd cert` writes in `--out-dir` (mode 0600).
pub const KEY_FILE: &str = "key.pem";
/// How long a generated certificate is valid: long, since it is pinned, not CA-checked.
const VALIDITY_YEARS: i32 = 10;

#[derive(Debug, Clone, clap::Args)]
pub struct CertArgs {
    /// Directory for cert.pem and key.pem (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out_dir: PathBuf,
    /// An extra DNS name or IP address for the certificate (repeatable); localhost,
    /// 127.0.0.1, ::1 and this machine's hostname are always included.
    #[arg(long = "host", value_name = "NAME")]
    pub hosts: Vec<String>,
    /// Replace an existing cert.pem/key.pem.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{0} exists (pass --force to replace it)")]
    Exists(PathBuf),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot generate the certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// A generated pair, in PEM, with its fingerprint.
pub struct SelfSigned {
    pub cert_pem: String,
    pub key_pem: String,
    /// SHA-256 of the DER certificate.
    pub fingerprint: [u8; 32],
    pub names: Vec<String>,
}

/// The certificate's names: the loopback ones, this host's name, then `extra`, deduplicated.
pub fn subject_names(extra: &[String]) -> Vec<String> {
    let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    names.extend(hostname());
    names.extend(extra.iter().map(|h| h.trim().to_owned()));
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| !n.is_empty() && seen.insert(n.to_ascii_lowercase()));
    names
}

/// Generates an ECDSA P-256 self-signed certificate for `names`.
pub fn generate(names: Vec<String>) -> Result<SelfSigned, CertError> {
    let mut params = CertificateParams::new(names.clone())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "acpd self-signed");
    dn.push(DnType::OrganizationName, "acpd self-signed");
    params.distinguished_name = dn;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    // A day of slack before now, for clocks that run a little behind ours.
    let start = chrono::Utc::now() - chrono::Duration::days(1);
    let day = |y: i32| rcgen::date_time_ymd(y, start.month() as u8, start.day().min(28) as u8);
    params.not_before = day(start.year());
    params.not_after = day(start.year() + VALIDITY_YEARS);
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok(SelfSigned {
        fingerprint: Sha256::digest(cert.der().as_ref()).into(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        names,
    })
}

/// `AB:CD:…`, the form most tools print.
pub fn colon_hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// `abcd…`, the form that is easiest to paste into a flag.
pub fn plain_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `DIR/cert.pem` (0644) and `DIR/key.pem` (0600); refuses to overwrite unless `force`.
pub fn write_pair(
    dir: &Path,
    pair: &SelfSigned,
    force: bool,
) -> Result<(PathBuf, PathBuf), CertError> {
    let cert_path = dir.join(CERT_FILE);
    let key_path = dir.join(KEY_FILE);
    if !force {
        for p in [&cert_path, &key_path] {
            if p.exists() {
                return Err(CertError::Exists(p.clone()));
            }
        }
    }
    std::fs::create_dir_all(dir).map_err(|source| CertError::Write {
        path: dir.to_owned(),
        source,
    })?;
    write_file(&key_path, &pair.key_pem, 0o600)?;
    write_file(&cert_path, &pair.cert_pem, 0o644)?;
    Ok((cert_path, key_path))
}

fn write_file(path: &Path, text: &str, mode: u32) -> Result<(), CertError> {
    let err = |source| CertError::Write {
        path: path.to_owned(),
        source,
    };
    // Removed first so that the mode applies even when the file existed (with --force):
    // `mode` only takes effect on creation.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)
}

/// The `acpd cert` command: the fingerprint goes to stdout (colon form, then plain), the
/// rest to stderr, so `acpd cert --out-dir D | tail -1` is the pin.
pub fn run(args: CertArgs) -> ExitCode {
    let names = subject_names(&args.hosts);
    let result = generate(names).and_then(|pair| {
        let paths = write_pair(&args.out_dir, &pair, args.force)?;
        Ok((pair, paths))
    });
    match result {
        Ok((pair, (cert, key))) => {
            eprintln!(
                "acpd: wrote {} and {} for {}",
                cert.display(),
                key.display(),
                pair.names.join(", ")
            );
            eprintln!(
                "acpd: serve with --tls-cert {} --tls-key {}; clients pin the SHA-256 below",
                cert.display(),
                key.display()
            );
            println!("{}", colon_hex(&pair.fingerprint));
            println!("{}", plain_hex(&pair.fingerprint));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("acpd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// This machine's hostname, if it has a usable one.
fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length, which is what we pass.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = std::str::from_utf8(&buf[..end]).ok()?.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_include_loopback_host_and_extras_once() {
        let names = subject_names(&["example.test".into(), "LOCALHOST".into(), "10.0.0.1".into()]);
        assert_eq!(&names[..3], ["localhost", "127.0.0.1", "::1"]);
        assert!(names.contains(&"example.test".to_owned()));
        assert!(names.contains(&"10.0.0.1".to_owned()));
        assert_eq!(
            names
                .iter()
                .filter(|n| n.eq_ignore_ascii_case("localhost"))
                .count(),
            1
        );
    }

    #[test]
    fn fingerprint_is_the_sha256_of_the_der() {
        use rustls::pki_types::pem::PemObject;
        let pair = generate(subject_names(&[])).expect("generate");
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pair.cert_pem.as_bytes())
            .expect("parse the PEM back");
        let digest: [u8; 32] = Sha256::digest(der.as_ref()).into();
        assert_eq!(digest, pair.fingerprint);
        let colon = colon_hex(&pair.fingerprint);
        assert_eq!(colon.len(), 32 * 3 - 1);
        assert_eq!(
            colon.replace(':', "").to_lowercase(),
            plain_hex(&pair.fingerprint)
        );
    }

    #[test]
    fn key_is_private_and_existing_files_are_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let pair = generate(subject_names(&[])).expect("generate");
        let (cert, key) = write_pair(dir.path(), &pair, false).expect("write");
        let mode = std::fs::metadata(&key).expect("key").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(
            std::fs::read_to_string(&cert)
                .expect("cert")
                .contains("BEGIN CERTIFICATE")
        );
        assert!(matches!(
            write_pair(dir.path(), &pair, false),
            Err(CertError::Exists(_))
        ));
        write_pair(dir.path(), &pair, true).expect("--force replaces");
    }
}

//! The internal link over TLS: replicas serving TLS advertise `wss://`, and a non-owner
//! dials its owner over rustls, trusting `cluster_ca_file` (here the replicas' own
//! self-signed certificate). A replica that does not trust the owner's certificate never
//! sends it the secret: it cannot forward. A bad CA file is a config error.

use super::takeover::{replica, secret};
use crate::support::Daemon;
use crate::support::security_support::{acpd, client, make_cert, trusting, wss_url};

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn a_client_on_a_non_owner_streams_the_owners_session_over_a_tls_link() {
    let s = secret();
    let certs = tempfile::tempdir().expect("temp dir");
    let cert = make_cert(certs.path()).await;
    let ca = cert.cert.display().to_string();
    let tls_replica = |name: &str| {
        let mut opts = replica(name, 2000, &s.path).advertise_wss();
        opts.args.extend(cert.args());
        opts
    };
    let a = Daemon::start_with(tls_replica("a").postgres()).await;
    let b = Daemon::start_beside(&a, tls_replica("b").arg("--cluster-ca-file", &ca)).await;
    // C serves TLS too but trusts only the web PKI: A's certificate is not good enough.
    let c = Daemon::start_beside(&a, tls_replica("c")).await;
    let trust = || Some(trusting(&cert.cert));
    let cwd = a.work_dir();
    let mut on_a = client(&wss_url(&a), &[], trust()).await;
    let sid = on_a.open_session(&cwd).await;

    let mut on_b = client(&wss_url(&b), &[], trust()).await;
    super::prompt_through(&mut on_b, &sid, 40).await;

    let mut on_c = client(&wss_url(&c), &[], trust()).await;
    let (_, refused) = on_c.prompt(&sid, "echo never").await;
    let err = refused.expect_err("c cannot verify a's certificate, so it does not forward");
    assert_eq!(err.code, -32012, "reported as an unreachable owner: {err}");
}

#[tokio::test]
async fn a_cluster_ca_file_that_is_not_pem_certificates_is_a_bad_config() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().display().to_string();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "0123456789abcdef0123").expect("write secret");
    let bad = dir.path().join("ca.pem");
    std::fs::write(&bad, "no certificate here\n").expect("write ca");
    let (secret, bad) = (secret.display().to_string(), bad.display().to_string());
    let missing = dir.path().join("missing.pem").display().to_string();
    for ca in [&bad, &missing] {
        let run = acpd(&[
            "check-config",
            "--data-dir",
            &data,
            "--replicas",
            "--store",
            "postgres://postgres@127.0.0.1:5432/none",
            "--cluster-secret-file",
            &secret,
            "--cluster-ca-file",
            ca,
        ])
        .await;
        assert_eq!(run.code, Some(64), "{ca}: {}", run.stderr);
        assert!(run.stderr.contains("cluster_ca_file"), "{}", run.stderr);
    }
}

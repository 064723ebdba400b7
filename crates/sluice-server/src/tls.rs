//! HTTPS: a rustls server configuration from PEM files
//! (`--ssl-certfile`, `--ssl-keyfile`, as vLLM names them).
//!
//! Promises: a missing, unreadable or malformed file is an error naming the
//! flag and the file; the server speaks HTTP/1.1 over TLS 1.2 or 1.3.

use anyhow::{anyhow, Context, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::PathBuf;
use std::sync::Arc;

/// Where the certificate chain and its private key are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

/// Builds the TLS acceptor, or says which file is wrong.
pub fn acceptor(files: &TlsFiles) -> Result<tokio_rustls::TlsAcceptor> {
    let cert_path = files.cert_file.display();
    let key_path = files.key_file.display();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert_file)
        .map_err(|e| anyhow!("--ssl-certfile {cert_path}: {e}"))?
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow!("--ssl-certfile {cert_path}: {e}"))?;
    if certs.is_empty() {
        return Err(anyhow!(
            "--ssl-certfile {cert_path}: no PEM certificate in the file"
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key_file)
        .map_err(|e| anyhow!("--ssl-keyfile {key_path}: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS: no protocol version available")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| anyhow!("--ssl-certfile {cert_path} / --ssl-keyfile {key_path}: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

//! TLS 1.3 with mutual authentication: a cluster CA signs every node's certificate.
//!
//! * Every certificate carries one cluster-wide DNS name, `tls.server_name` (default
//!   `pushpull.cluster`), as its subject alternative name. **Clients verify that name**, not an
//!   IP address, so certificates don't depend on where nodes run.
//! * Servers (the scheduler, every pushpull server) require a client certificate signed by the
//!   cluster CA ([`rustls::server::WebPkiClientVerifier`]); a client without one, or with one
//!   from another CA, is refused at the handshake. Clients accept only a server certificate
//!   signed by the cluster CA. So only holders of a cluster certificate can register, push or
//!   pull.
//! * Each certificate also states the role (and id) its holder may play; nodes check it at
//!   the application level ([`crate::certs::peer_grant`], [`pushpull_proto::grant`]).
//! * A private key file that group or others may read is warned about at load, or refused
//!   with `tls.refuse_loose_keys` (as ssh does).
//! * [`crate::certs::generate_cluster`] makes a CA and node certificates. Only the
//!   `ring` provider is used (aws-lc-rs costs minutes of build time).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use pushpull_proto::config::TlsConfig;

/// ALPN protocol id of pushpull.
pub const ALPN: &[u8] = b"pushpull/1";

/// A TLS setup error; names the file and what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or parsed.
    #[error("TLS: {what} {path}: {message}")]
    File {
        /// `CA certificate`, `certificate` or `private key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A `[tls]` key is missing.
    #[error(
        "TLS: `tls.{0}` is not set (pushpull certs --out DIR makes a CA and node certificates)"
    )]
    Missing(&'static str),
    /// rustls or rcgen refused.
    #[error("TLS: {0}")]
    Setup(String),
}

/// A node's loaded TLS identity and trust root.
#[derive(Debug, Clone)]
pub struct TlsIdentity {
    /// The cluster CA.
    pub ca: CertificateDer<'static>,
    /// This node's certificate chain.
    pub chain: Vec<CertificateDer<'static>>,
    /// This node's key.
    pub key: Arc<PrivateKeyDer<'static>>,
    /// The name clients verify.
    pub server_name: String,
}

impl TlsIdentity {
    /// Loads the PEM files named by `[tls]`.
    pub fn load(cfg: &TlsConfig) -> Result<TlsIdentity, TlsError> {
        let ca_path = cfg.ca.as_ref().ok_or(TlsError::Missing("ca"))?;
        let cert_path = cfg.cert.as_ref().ok_or(TlsError::Missing("cert"))?;
        let key_path = cfg.key.as_ref().ok_or(TlsError::Missing("key"))?;
        let file_err = |what, path: &Path, e: String| TlsError::File {
            what,
            path: path.to_path_buf(),
            message: e,
        };
        let ca = CertificateDer::from_pem_file(ca_path)
            .map_err(|e| file_err("CA certificate", ca_path, e.to_string()))?;
        let chain = CertificateDer::pem_file_iter(cert_path)
            .map_err(|e| file_err("certificate", cert_path, e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| file_err("certificate", cert_path, e.to_string()))?;
        if chain.is_empty() {
            return Err(file_err(
                "certificate",
                cert_path,
                "no certificate in file".into(),
            ));
        }
        check_key_permissions(key_path, cfg.refuse_loose_keys)
            .map_err(|e| file_err("private key", key_path, e))?;
        let key = PrivateKeyDer::from_pem_file(key_path)
            .map_err(|e| file_err("private key", key_path, e.to_string()))?;
        Ok(TlsIdentity {
            ca,
            chain,
            key: Arc::new(key),
            server_name: cfg.server_name.clone(),
        })
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn roots(&self) -> Result<Arc<rustls::RootCertStore>, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.ca.clone())
            .map_err(|e| TlsError::Setup(format!("cluster CA certificate: {e}")))?;
        Ok(Arc::new(roots))
    }

    /// rustls server config: TLS 1.3 only, client certificates required and verified against
    /// the cluster CA.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots()?,
            Self::provider(),
        )
        .build()
        .map_err(|e| TlsError::Setup(format!("client verifier: {e}")))?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(Self::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Setup(format!("node certificate/key: {e}")))?;
        cfg.alpn_protocols = vec![ALPN.to_vec()];
        Ok(cfg)
    }

    /// rustls client config: TLS 1.3 only, server certificate verified against the cluster CA
    /// (for the name [`TlsIdentity::server_name`]), this node's certificate presented.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let mut cfg = rustls::ClientConfig::builder_with_provider(Self::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Setup(format!("node certificate/key: {e}")))?;
        cfg.alpn_protocols = vec![ALPN.to_vec()];
        Ok(cfg)
    }
}

/// Warns about a key file that group or others may read, or refuses it (`refuse`).
fn check_key_permissions(path: &Path, refuse: bool) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            let what = format!("readable by group or others (mode {mode:04o}); `chmod 600` it");
            if refuse {
                return Err(format!("{what} (tls.refuse_loose_keys is set)"));
            }
            tracing::warn!("TLS: private key {}: {what}", path.display());
        }
    }
    #[cfg(not(unix))]
    let _ = (path, refuse);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_files_are_named() {
        let cfg = TlsConfig {
            ca: Some("/nonexistent/ca.pem".into()),
            cert: Some("/nonexistent/n.pem".into()),
            key: Some("/nonexistent/n.key".into()),
            server_name: "x".into(),
            ..TlsConfig::default()
        };
        let e = TlsIdentity::load(&cfg).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let e = TlsIdentity::load(&TlsConfig::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("tls.ca"), "{e}");
    }
}

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
//! * [`generate_cluster`] makes a CA and node certificates (`pushpull certs`, and the throw-away
//!   set of `pushpull local`). Only the `ring` provider is used (aws-lc-rs costs minutes of
//!   build time).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
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

/// File names [`generate_cluster`] writes into its output folder.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA's private key (keep it off the nodes).
pub const CA_KEY_FILE: &str = "ca.key";

/// Makes a cluster CA and one certificate per node name in `dir`: `ca.pem`, `ca.key`, and for
/// each name `NAME.pem` + `NAME.key`. Every node certificate carries `server_name` as its DNS
/// name (and `NAME` as its common name), usable both as client and as server certificate.
/// Returns the [`TlsConfig`] of each node, in the order of `nodes`.
pub fn generate_cluster(
    dir: &Path,
    server_name: &str,
    nodes: &[String],
) -> Result<Vec<TlsConfig>, TlsError> {
    let setup = |e: rcgen::Error| TlsError::Setup(format!("certificate generation: {e}"));
    std::fs::create_dir_all(dir).map_err(|e| TlsError::File {
        what: "output folder",
        path: dir.to_path_buf(),
        message: e.to_string(),
    })?;
    let ca_key = KeyPair::generate().map_err(setup)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(setup)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "pushpull cluster CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(setup)?;
    write_file(&dir.join(CA_CERT_FILE), ca_cert.pem().as_bytes())?;
    write_file(&dir.join(CA_KEY_FILE), ca_key.serialize_pem().as_bytes())?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut out = Vec::with_capacity(nodes.len());
    for name in nodes {
        let key = KeyPair::generate().map_err(setup)?;
        let mut params = CertificateParams::new(vec![server_name.to_string()]).map_err(setup)?;
        params
            .distinguished_name
            .push(DnType::CommonName, name.as_str());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &issuer).map_err(setup)?;
        let cert_path = dir.join(format!("{name}.pem"));
        let key_path = dir.join(format!("{name}.key"));
        write_file(&cert_path, cert.pem().as_bytes())?;
        write_file(&key_path, key.serialize_pem().as_bytes())?;
        out.push(TlsConfig {
            ca: Some(dir.join(CA_CERT_FILE)),
            cert: Some(cert_path),
            key: Some(key_path),
            server_name: server_name.to_string(),
        });
    }
    Ok(out)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    std::fs::write(path, bytes).map_err(|e| TlsError::File {
        what: "output file",
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_cluster_loads_and_builds_configs() {
        let dir = tempfile::tempdir().unwrap();
        let cfgs = generate_cluster(dir.path(), "pushpull.cluster", &["node0".into()]).unwrap();
        let id = TlsIdentity::load(&cfgs[0]).unwrap();
        id.server_config().unwrap();
        id.client_config().unwrap();
    }

    #[test]
    fn missing_files_are_named() {
        let cfg = TlsConfig {
            ca: Some("/nonexistent/ca.pem".into()),
            cert: Some("/nonexistent/n.pem".into()),
            key: Some("/nonexistent/n.key".into()),
            server_name: "x".into(),
        };
        let e = TlsIdentity::load(&cfg).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let e = TlsIdentity::load(&TlsConfig::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("tls.ca"), "{e}");
    }
}

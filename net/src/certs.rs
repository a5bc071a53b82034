//! Certificates: making a cluster CA and node certificates ([`generate_cluster`], used by
//! `pushpull certs` and the throw-away sets of `pushpull local` and the tests), and reading the
//! role a peer's certificate grants ([`peer_grant`]).
//!
//! # Layout of a generated cluster
//! ```text
//! DIR/ca/ca.pem, DIR/ca/ca.key     the CA: stays where it was made (its key signs members)
//! DIR/NAME/ca.pem                  for each node NAME: the CA certificate,
//! DIR/NAME/NAME.pem, NAME.key      its certificate and key: copy DIR/NAME/ to that host
//! ```
//! Every private key is written with mode 0600 whatever the umask (created under a temporary
//! name with that mode, then renamed into place). Every node certificate carries the cluster's
//! DNS name (`tls.server_name`, which clients verify), the node name as its common name, and,
//! for the conventional names (`scheduler`, `serverN`, `workerN`), its
//! [`Grant`] as a `pushpull://` URI. Certificates are valid from
//! an hour ago (clock skew) for `validity_days`.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use pushpull_proto::config::TlsConfig;
use pushpull_proto::grant::{Grant, PeerGrant};

use crate::tls::TlsError;

/// The CA certificate's file name (in `DIR/ca/` and in every node's folder).
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA's private key (`DIR/ca/ca.key`; keep it off the nodes).
pub const CA_KEY_FILE: &str = "ca.key";
/// The CA's folder in a generated cluster.
pub const CA_DIR: &str = "ca";
/// Default validity of generated certificates, in days.
pub const DEFAULT_VALIDITY_DAYS: u32 = 365;

/// One node to make a certificate for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCert {
    /// Its name: the folder, file and common name.
    pub name: String,
    /// What its certificate grants (`None`: no `pushpull://` URI, a role-free certificate).
    pub grant: Option<Grant>,
}

impl NodeCert {
    /// A node with the grant its conventional name implies ([`Grant::of_node_name`]).
    pub fn named(name: &str) -> NodeCert {
        NodeCert {
            name: name.to_string(),
            grant: Grant::of_node_name(name),
        }
    }
}

/// [`generate_cluster_with`] for conventionally named nodes, valid for
/// [`DEFAULT_VALIDITY_DAYS`].
pub fn generate_cluster(
    dir: &Path,
    server_name: &str,
    nodes: &[String],
) -> Result<Vec<TlsConfig>, TlsError> {
    let nodes: Vec<NodeCert> = nodes.iter().map(|n| NodeCert::named(n)).collect();
    generate_cluster_with(dir, server_name, &nodes, DEFAULT_VALIDITY_DAYS)
}

/// Makes a cluster CA and a certificate per node in `dir` (see the module docs for the
/// layout). Returns the [`TlsConfig`] of each node, in the order of `nodes`.
pub fn generate_cluster_with(
    dir: &Path,
    server_name: &str,
    nodes: &[NodeCert],
    validity_days: u32,
) -> Result<Vec<TlsConfig>, TlsError> {
    let setup = |e: rcgen::Error| TlsError::Setup(format!("certificate generation: {e}"));
    let not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    let not_after = not_before + time::Duration::days(i64::from(validity_days.max(1)));
    let ca_dir = dir.join(CA_DIR);
    make_dir(&ca_dir)?;
    let ca_key = KeyPair::generate().map_err(setup)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(setup)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "pushpull cluster CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (ca_params.not_before, ca_params.not_after) = (not_before, not_after);
    let ca_cert = ca_params.self_signed(&ca_key).map_err(setup)?;
    let ca_pem = ca_cert.pem();
    write_file(&ca_dir.join(CA_CERT_FILE), ca_pem.as_bytes())?;
    write_private(&ca_dir.join(CA_KEY_FILE), ca_key.serialize_pem().as_bytes())?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut out = Vec::with_capacity(nodes.len());
    for node in nodes {
        let name = &node.name;
        let key = KeyPair::generate().map_err(setup)?;
        let mut params = CertificateParams::new(vec![server_name.to_string()]).map_err(setup)?;
        if let Some(grant) = node.grant {
            let uri = grant.uri().try_into().map_err(setup)?;
            params.subject_alt_names.push(SanType::URI(uri));
        }
        params
            .distinguished_name
            .push(DnType::CommonName, name.as_str());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        (params.not_before, params.not_after) = (not_before, not_after);
        let cert = params.signed_by(&key, &issuer).map_err(setup)?;
        let node_dir = dir.join(name);
        make_dir(&node_dir)?;
        let ca_path = node_dir.join(CA_CERT_FILE);
        let cert_path = node_dir.join(format!("{name}.pem"));
        let key_path = node_dir.join(format!("{name}.key"));
        write_file(&ca_path, ca_pem.as_bytes())?;
        write_file(&cert_path, cert.pem().as_bytes())?;
        write_private(&key_path, key.serialize_pem().as_bytes())?;
        out.push(TlsConfig {
            ca: Some(ca_path),
            cert: Some(cert_path),
            key: Some(key_path),
            server_name: server_name.to_string(),
            ..TlsConfig::default()
        });
    }
    Ok(out)
}

fn make_dir(dir: &Path) -> Result<(), TlsError> {
    std::fs::create_dir_all(dir).map_err(|e| TlsError::File {
        what: "output folder",
        path: dir.to_path_buf(),
        message: e.to_string(),
    })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    std::fs::write(path, bytes).map_err(|e| TlsError::File {
        what: "output file",
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Writes a private key: created under a temporary name with mode 0600 (whatever the umask),
/// then renamed over `path`, so the key is never readable by others, even for a moment.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    let err = |path: &Path, e: std::io::Error| TlsError::File {
        what: "private key",
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp_name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options.open(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(path, e));
    }
    Ok(())
}

/// The grants a certificate (DER) states, from its `pushpull://` subject-alternative-name
/// URIs.
pub fn cert_grants(der: &[u8]) -> Result<Vec<Grant>, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("unreadable certificate: {e}"))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("unreadable subject alternative names: {e}"))?;
    Ok(san
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::URI(uri) => Grant::from_uri(uri),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default())
}

/// What the certificate a peer presented on `conn` grants, if roles are checked
/// (`check_roles`): exactly one grant, or [`PeerGrant::None`] (no grant, several, or an
/// unreadable certificate: refused alike, with the reason in the log).
pub fn peer_grant(conn: &quinn::Connection, check_roles: bool) -> PeerGrant {
    if !check_roles {
        return PeerGrant::Unchecked;
    }
    let Some(certs) = conn.peer_identity().and_then(|id| {
        id.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .ok()
    }) else {
        return PeerGrant::None;
    };
    let Some(leaf) = certs.first() else {
        return PeerGrant::None;
    };
    match cert_grants(leaf) {
        Ok(g) if g.len() == 1 => PeerGrant::Grants(g[0]),
        Ok(g) => {
            tracing::warn!(peer = %conn.remote_address(), "certificate states {} grants", g.len());
            PeerGrant::None
        }
        Err(e) => {
            tracing::warn!(peer = %conn.remote_address(), "{e}");
            PeerGrant::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::TlsIdentity;
    use pushpull_proto::protocol::NodeRole;

    #[test]
    fn generated_certificates_state_their_grants_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = [
            NodeCert::named("scheduler"),
            NodeCert::named("worker3"),
            NodeCert::named("rogue"),
            NodeCert {
                name: "anyserver".into(),
                grant: Some(Grant {
                    role: NodeRole::Server,
                    id: None,
                }),
            },
        ];
        let cfgs = generate_cluster_with(dir.path(), "pushpull.cluster", &nodes, 30).unwrap();
        for (node, cfg) in nodes.iter().zip(&cfgs) {
            let id = TlsIdentity::load(cfg).unwrap();
            assert_eq!(
                cert_grants(&id.chain[0]).unwrap(),
                node.grant.into_iter().collect::<Vec<_>>(),
                "{}",
                node.name
            );
            assert_eq!(
                cfg.cert.as_deref().unwrap().parent().unwrap(),
                dir.path().join(&node.name),
                "each node's files in its own folder"
            );
        }
        assert!(dir.path().join("ca/ca.key").exists());
        assert!(!dir.path().join("worker3/ca.key").exists());
    }

    #[cfg(unix)]
    #[test]
    fn private_keys_are_0600_whatever_the_umask_and_certificates_expire() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cfgs = generate_cluster_with(
            dir.path(),
            "pushpull.cluster",
            &[NodeCert::named("worker0")],
            30,
        )
        .unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(cfgs[0].key.as_deref().unwrap()), 0o600);
        assert_eq!(mode(&dir.path().join("ca/ca.key")), 0o600);
        // Certificates are public: the umask's usual 0644.
        assert_eq!(mode(cfgs[0].cert.as_deref().unwrap()) & 0o044, 0o044);
        let id = TlsIdentity::load(&cfgs[0]).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&id.chain[0]).unwrap();
        let days = (cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp())
            / 86_400;
        assert_eq!(days, 30);
        // Replacing a key keeps the mode (the temporary file is renamed over it).
        write_private(cfgs[0].key.as_deref().unwrap(), b"x").unwrap();
        assert_eq!(mode(cfgs[0].key.as_deref().unwrap()), 0o600);
    }

    #[test]
    fn generated_cluster_loads_and_builds_configs() {
        let dir = tempfile::tempdir().unwrap();
        let cfgs = generate_cluster(dir.path(), "pushpull.cluster", &["node0".into()]).unwrap();
        let id = TlsIdentity::load(&cfgs[0]).unwrap();
        id.server_config().unwrap();
        id.client_config().unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_key_others_may_read_is_refused_when_asked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = generate_cluster(dir.path(), "pushpull.cluster", &["worker0".into()])
            .unwrap()
            .remove(0);
        let key = cfg.key.clone().unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        TlsIdentity::load(&cfg).expect("only a warning by default");
        cfg.refuse_loose_keys = true;
        let e = TlsIdentity::load(&cfg).unwrap_err().to_string();
        assert!(
            e.contains("worker0.key") && e.contains("mode 0644") && e.contains("chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        TlsIdentity::load(&cfg).unwrap();
    }
}

//! `pushpull certs`: a cluster CA and one certificate per node, for a multi-host cluster.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use pushpull_net::certs::{generate_cluster_with, NodeCert, CA_CERT_FILE, CA_DIR, CA_KEY_FILE};

use pushpull_node::error::{CliError, CliResult};

/// Node names for a cluster of one scheduler, `servers` servers and `workers` workers:
/// `scheduler`, `server0`, …, `worker0`, ….
pub fn default_node_names(servers: u32, workers: u32) -> Vec<String> {
    std::iter::once("scheduler".to_string())
        .chain((0..servers).map(|i| format!("server{i}")))
        .chain((0..workers).map(|i| format!("worker{i}")))
        .collect()
}

/// Checks a node name: it becomes a file name, so letters, digits, `-`, `_` and `.` only.
pub fn check_node_name(name: &str) -> CliResult<()> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(CliError::usage(format!(
            "--nodes: node name {name:?} is not allowed (letters, digits, '-', '_', '.'; \
             not starting with '.')"
        )));
    }
    if name == "ca" {
        return Err(CliError::usage(
            "--nodes: node name \"ca\" is reserved for the CA's files",
        ));
    }
    Ok(())
}

/// Writes the CA and node certificates (valid for `days`) into `out` and returns the text to
/// print: which folder goes to which host, and each node's `[tls]` table. Refuses to
/// overwrite an existing CA unless `force`.
pub fn make_certs(
    out: &Path,
    nodes: &[String],
    server_name: &str,
    force: bool,
    days: u32,
) -> CliResult<String> {
    if nodes.is_empty() {
        return Err(CliError::usage("--nodes: no node names given"));
    }
    for n in nodes {
        check_node_name(n)?;
    }
    let mut seen = std::collections::BTreeSet::new();
    for n in nodes {
        if !seen.insert(n) {
            return Err(CliError::usage(format!(
                "--nodes: node name {n:?} given twice"
            )));
        }
    }
    if server_name.is_empty() {
        return Err(CliError::usage("--server-name: must not be empty"));
    }
    if days == 0 {
        return Err(CliError::usage("--days 0: must be at least 1"));
    }
    let ca_dir = out.join(CA_DIR);
    if ca_dir.join(CA_CERT_FILE).exists() && !force {
        return Err(CliError::usage(format!(
            "--out {}: already holds a CA ({CA_DIR}/{CA_CERT_FILE}); pass --force to replace it \
             (every node then needs new certificates)",
            out.display()
        )));
    }
    let certs: Vec<NodeCert> = nodes.iter().map(|n| NodeCert::named(n)).collect();
    let cfgs = generate_cluster_with(out, server_name, &certs, days).map_err(CliError::usage)?;
    let abs = |p: &Option<PathBuf>| -> String {
        let p = p.clone().unwrap_or_default();
        std::fs::canonicalize(&p).unwrap_or(p).display().to_string()
    };
    let mut text = String::new();
    let _ = writeln!(
        text,
        "Wrote a cluster CA and {} node certificates to {}, valid for {days} days (every \
         certificate names {server_name:?}, the name clients verify: set \
         `tls.server_name = {server_name:?}` if it is not the default).",
        nodes.len(),
        out.display()
    );
    let _ = writeln!(
        text,
        "Keep {} where it is: its key ({CA_KEY_FILE}, like every key readable by you only) \
         signs new members. Copy each node's folder {}/NAME/ to that node's host, and put in \
         its cluster file:",
        ca_dir.display(),
        out.display()
    );
    for (cert, _) in certs.iter().zip(&cfgs).filter(|(c, _)| c.grant.is_none()) {
        let _ = writeln!(
            text,
            "(note: {:?} is not a conventional name (scheduler, serverN, workerN), so its \
             certificate grants no role: it works only with `tls.check_roles = false`)",
            cert.name
        );
    }
    for (name, cfg) in nodes.iter().zip(&cfgs) {
        let _ = writeln!(text);
        let _ = writeln!(text, "# {name}");
        let _ = writeln!(text, "[tls]");
        let _ = writeln!(text, "ca = {:?}", abs(&cfg.ca));
        let _ = writeln!(text, "cert = {:?}", abs(&cfg.cert));
        let _ = writeln!(text, "key = {:?}", abs(&cfg.key));
    }
    let _ = writeln!(
        text,
        "\n(or pass --ca/--cert/--key to pushpull-scheduler, pushpull-server, pushpull-worker)"
    );
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_refusals() {
        assert_eq!(
            default_node_names(1, 2),
            vec!["scheduler", "server0", "worker0", "worker1"]
        );
        let dir = tempfile::tempdir().unwrap();
        let text = make_certs(
            dir.path(),
            &default_node_names(1, 1),
            "pushpull.cluster",
            false,
            30,
        )
        .unwrap();
        assert!(
            text.contains("server0.pem") && text.contains("# worker0"),
            "{text}"
        );
        let e = make_certs(dir.path(), &["a".into()], "x", false, 30).unwrap_err();
        assert!(e.to_string().contains("--force"), "{e}");
        let e = make_certs(dir.path(), &["../x".into()], "x", true, 30).unwrap_err();
        assert!(e.to_string().contains("../x"), "{e}");
        assert_eq!(e.exit_code(), 2);
    }
}

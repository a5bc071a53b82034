//! What a node's certificate lets its holder be: a role and, where the certificate fixes it,
//! an id (a worker's rank, a server's id).
//!
//! A certificate states its grant as a subject-alternative-name URI:
//! `pushpull://scheduler`, `pushpull://server/2`, `pushpull://worker/3`, or `pushpull://worker`
//! (a worker of any rank). `pushpull certs` writes one per node; the networking crate reads it
//! from a peer's certificate. Every node checks the grant of the peers it talks to, unless
//! `tls.check_roles = false` (for certificates from one's own PKI that carry no such URI):
//! * the scheduler admits a registration only in the role, and with the id, its certificate
//!   grants ([`Grant::allows`]), and refuses a certificate without a grant;
//! * workers and servers accept as the scheduler only a certificate granting `scheduler`;
//! * workers accept as server `i` only a certificate granting server `i` (or any server);
//! * servers accept a worker's `Hello` for rank `r` only from a certificate granting worker
//!   `r` (or any worker).

use std::fmt;

use crate::protocol::NodeRole;

/// The scheme of a grant URI.
pub const GRANT_URI_PREFIX: &str = "pushpull://";

/// A role and, if the certificate fixes it, the id (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The role.
    pub role: NodeRole,
    /// The worker rank or server id; `None`: any (and always `None` for the scheduler).
    pub id: Option<u32>,
}

fn role_word(role: NodeRole) -> &'static str {
    match role {
        NodeRole::Scheduler => "scheduler",
        NodeRole::Server => "server",
        NodeRole::Worker => "worker",
    }
}

impl Grant {
    /// The grant of the conventional node names `pushpull certs` uses: `scheduler`,
    /// `server<N>`, `worker<N>`. Other names get none.
    pub fn of_node_name(name: &str) -> Option<Grant> {
        if name == "scheduler" {
            return Some(Grant {
                role: NodeRole::Scheduler,
                id: None,
            });
        }
        for role in [NodeRole::Server, NodeRole::Worker] {
            if let Some(n) = name.strip_prefix(role_word(role)) {
                if let Ok(id) = n.parse::<u32>() {
                    if n == id.to_string() {
                        return Some(Grant { role, id: Some(id) });
                    }
                }
            }
        }
        None
    }

    /// The URI a certificate carries, e.g. `pushpull://worker/3`.
    pub fn uri(&self) -> String {
        match self.id {
            Some(id) if self.role != NodeRole::Scheduler => {
                format!("{GRANT_URI_PREFIX}{}/{id}", role_word(self.role))
            }
            _ => format!("{GRANT_URI_PREFIX}{}", role_word(self.role)),
        }
    }

    /// Reads a URI written by [`Grant::uri`]; `None` for any other URI (so a certificate may
    /// carry other URIs too).
    pub fn from_uri(uri: &str) -> Option<Grant> {
        let rest = uri.strip_prefix(GRANT_URI_PREFIX)?;
        let (word, id) = match rest.split_once('/') {
            Some((w, id)) => {
                let n: u32 = id.parse().ok()?;
                (n.to_string() == id).then_some(())?;
                (w, Some(n))
            }
            None => (rest, None),
        };
        let role = [NodeRole::Scheduler, NodeRole::Server, NodeRole::Worker]
            .into_iter()
            .find(|r| role_word(*r) == word)?;
        if role == NodeRole::Scheduler && id.is_some() {
            return None;
        }
        Some(Grant { role, id })
    }

    /// Whether this grant lets its holder act as `role` with `id` (`None`: the id is not
    /// known yet, e.g. a worker that asks for no rank). The error reads "certificate of
    /// worker 2 cannot act as server 0".
    pub fn allows(&self, role: NodeRole, id: Option<u32>) -> Result<(), String> {
        let ok = self.role == role
            && match (self.id, id) {
                (Some(mine), Some(asked)) => mine == asked,
                _ => true,
            };
        if ok {
            return Ok(());
        }
        let asked = match (role, id) {
            (NodeRole::Scheduler, _) => "the scheduler".to_string(),
            (r, Some(id)) => format!("{} {id}", role_word(r)),
            (r, None) => format!("a {}", role_word(r)),
        };
        Err(format!("certificate of {self} cannot act as {asked}"))
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.role, self.id) {
            (NodeRole::Scheduler, _) => f.write_str("the scheduler"),
            (r, Some(id)) => write!(f, "{} {id}", role_word(r)),
            (r, None) => write!(
                f,
                "a {} (any {})",
                role_word(r),
                match r {
                    NodeRole::Worker => "rank",
                    _ => "id",
                }
            ),
        }
    }
}

/// What a node knows of a peer's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerGrant {
    /// Roles are not checked (`tls.check_roles = false`).
    Unchecked,
    /// The certificate grants this.
    Grants(Grant),
    /// Roles are checked and the certificate carries no grant.
    None,
}

impl PeerGrant {
    /// [`Grant::allows`], with the refusal for a certificate without a grant.
    pub fn allows(&self, role: NodeRole, id: Option<u32>) -> Result<(), String> {
        match self {
            PeerGrant::Unchecked => Ok(()),
            PeerGrant::Grants(g) => g.allows(role, id),
            PeerGrant::None => Err(format!(
                "certificate grants no pushpull role (it carries no {GRANT_URI_PREFIX} URI; \
                 `pushpull certs` writes one; set tls.check_roles = false to run with \
                 certificates that carry none)"
            )),
        }
    }

    /// The id the certificate fixes, if any.
    pub fn id(&self) -> Option<u32> {
        match self {
            PeerGrant::Grants(g) => g.id,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_uris_and_grants_round_trip() {
        for (name, uri) in [
            ("scheduler", "pushpull://scheduler"),
            ("server0", "pushpull://server/0"),
            ("worker17", "pushpull://worker/17"),
        ] {
            let g = Grant::of_node_name(name).unwrap();
            assert_eq!(g.uri(), uri);
            assert_eq!(Grant::from_uri(uri), Some(g));
        }
        let any = Grant {
            role: NodeRole::Worker,
            id: None,
        };
        assert_eq!(Grant::from_uri(&any.uri()), Some(any));
        for name in [
            "rogue",
            "worker",
            "worker01",
            "server-1",
            "worker1x",
            "Scheduler",
        ] {
            assert_eq!(Grant::of_node_name(name), None, "{name}");
        }
        for uri in [
            "pushpull://scheduler/0",
            "pushpull://worker/01",
            "pushpull://worker/-1",
            "pushpull://admin",
            "https://worker/1",
            "pushpull://worker/1/2",
        ] {
            assert_eq!(Grant::from_uri(uri), None, "{uri}");
        }
    }

    #[test]
    fn a_grant_allows_its_role_and_id_only() {
        let w2 = Grant::of_node_name("worker2").unwrap();
        assert_eq!(w2.allows(NodeRole::Worker, Some(2)), Ok(()));
        assert_eq!(w2.allows(NodeRole::Worker, None), Ok(()));
        assert_eq!(
            w2.allows(NodeRole::Worker, Some(1)),
            Err("certificate of worker 2 cannot act as worker 1".into())
        );
        assert_eq!(
            w2.allows(NodeRole::Server, None),
            Err("certificate of worker 2 cannot act as a server".into())
        );
        assert_eq!(
            w2.allows(NodeRole::Scheduler, None),
            Err("certificate of worker 2 cannot act as the scheduler".into())
        );
        let any = Grant {
            role: NodeRole::Server,
            id: None,
        };
        assert_eq!(any.allows(NodeRole::Server, Some(7)), Ok(()));
        assert!(PeerGrant::None
            .allows(NodeRole::Worker, None)
            .unwrap_err()
            .contains("tls.check_roles = false"));
        assert_eq!(
            PeerGrant::Unchecked.allows(NodeRole::Scheduler, None),
            Ok(())
        );
    }
}

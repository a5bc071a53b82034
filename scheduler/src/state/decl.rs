//! What one worker's declare of a tensor asked for ([`Decl`]), and how two declarations differ
//! ([`Diff`], described in the error every worker gets).

use std::collections::BTreeSet;
use std::fmt;

use pushpull_proto::config::ParamMap;
use pushpull_proto::protocol::TensorPlacement;

/// What one worker's declare asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Decl {
    pub(super) len: u64,
    pub(super) params: ParamMap,
    /// `None`: the default (declaration order).
    pub(super) priority: Option<i32>,
}

impl Decl {
    /// The declaration that produced `p`, with the priority it asked for.
    pub(super) fn of_placement(p: &TensorPlacement, requested: Option<i32>) -> Decl {
        Decl {
            len: p.len,
            params: p.params.clone(),
            priority: requested,
        }
    }

    /// The first difference from `other` (length, then parameters in key order, then the
    /// priority); `None` if they agree.
    pub(super) fn diff(&self, other: &Decl) -> Option<Diff> {
        if self.len != other.len {
            return Some(Diff::Len(self.len, other.len));
        }
        let keys: BTreeSet<&String> = self.params.keys().chain(other.params.keys()).collect();
        let param = keys.into_iter().find_map(|k| {
            let (a, b) = (self.params.get(k), other.params.get(k));
            (a != b).then(|| Diff::Param(k.clone(), a.cloned(), b.cloned()))
        });
        param.or_else(|| {
            (self.priority != other.priority)
                .then_some(Diff::Priority(self.priority, other.priority))
        })
    }
}

/// How two declarations of one tensor differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Diff {
    /// Element counts.
    Len(u64, u64),
    /// A parameter (absent = `None`).
    Param(String, Option<String>, Option<String>),
    /// The requested priority (`None`: the default).
    Priority(Option<i32>, Option<i32>),
}

/// Describes a difference of tensor `name`: `a` and `b` say who declared what, e.g.
/// `tensor "fc1.weight": worker 0 declared 1000 elements, worker 1 declared 999`.
pub(super) fn describe(name: &str, a: &str, b: &str, d: &Diff) -> String {
    match d {
        Diff::Len(la, lb) => format!("tensor {name:?}: {a} {la} elements, {b} {lb}"),
        Diff::Param(k, va, vb) => format!(
            "tensor {name:?}: {a} parameter {k} = {}, {b} {k} = {}",
            Shown(va.as_ref()),
            Shown(vb.as_ref())
        ),
        Diff::Priority(pa, pb) => {
            let shown = |p: &Option<i32>| p.map_or("(default)".to_string(), |p| p.to_string());
            format!(
                "tensor {name:?}: {a} priority {}, {b} priority {}",
                shown(pa),
                shown(pb)
            )
        }
    }
}

/// A parameter value for messages: quoted, or `(unset)`.
struct Shown<'a>(Option<&'a String>);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) => write!(f, "{v:?}"),
            None => f.write_str("(unset)"),
        }
    }
}

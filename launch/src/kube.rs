//! `pushpull prepare --kubernetes NAME`: the job folder as Kubernetes objects, written to
//! `DIR/kubernetes.yaml` for `kubectl apply -f` (plain manifests: JSON documents, which are
//! YAML, separated by `---`).
//!
//! | object | what it holds |
//! |---|---|
//! | ConfigMap `NAME` | `cluster.toml`, mounted at `/job` in every pod |
//! | Secret `NAME-tls` | `ca.pem` and every node's `<node>.pem` and `<node>.key` |
//! | Service `NAME` | headless (`clusterIP: None`), `publishNotReadyAddresses`, the scheduler's UDP port; selects the pod of completion index 0 (the scheduler), so `NAME` resolves to it |
//! | Job `NAME` | indexed, `completions = parallelism = 1 + S + W`, `backoffLimit: 0`, `restartPolicy: Never`: one failed pod fails the job, and Kubernetes ends the others |
//!
//! Each pod runs `pushpull node --job-dir /job --role auto --index $(INDEX) --tls-dir /tls`
//! (index 0 the scheduler, 1..=S the servers, then the workers, as [`crate::multihost`] counts
//! them), followed by the workers' command if one was given.
//!
//! **Each pod sees only its own certificate.** The Secret volume lays its keys out per index
//! (`items`: `worker0.key` → `3/worker0.key` for index 3, with `ca.pem` copied into every
//! folder), and the container mounts only its own folder at `/tls` with `subPathExpr:
//! $(INDEX)`, `INDEX` being the pod's `batch.kubernetes.io/job-completion-index` annotation
//! (downward API). A Job's pod spec cannot name a Secret per index, so the one Secret is the
//! source; the files of other nodes never appear inside a container.
//!
//! **The scheduler's name** is the Service's: `cluster.scheduler = NAME:PORT`, which a pod
//! resolves through its namespace's search domain (`NAME.<namespace>.svc.<cluster domain>`);
//! `NAME.<namespace>.svc:PORT` may be given instead ([`scheduler_addr`]). The Service selects
//! the index by the pod label `batch.kubernetes.io/job-completion-index`, which Kubernetes sets
//! from 1.28.

use std::path::Path;

use serde_json::{json, Value};

use pushpull_node::error::{CliError, CliResult};
use pushpull_proto::config::SchedulerAddr;
use pushpull_proto::Config;

/// `--image` when not given.
pub const DEFAULT_IMAGE: &str = "pushpull:latest";
/// The scheduler's port when `--scheduler` is not given.
pub const DEFAULT_PORT: u16 = 29500;
/// Where a pod mounts the cluster file (the `--job-dir` of `pushpull node`).
pub const POD_JOB_DIR: &str = "/job";
/// Where a pod mounts its own certificate folder (the `--tls-dir` of `pushpull node`).
pub const POD_TLS_DIR: &str = "/tls";
/// The annotation (and, from Kubernetes 1.28, the label) holding a pod's completion index.
pub const INDEX_KEY: &str = "batch.kubernetes.io/job-completion-index";
/// A Secret's size limit (1 MiB).
const SECRET_LIMIT: usize = 1 << 20;

/// One node's certificate and key, as PEM text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFiles {
    /// The node's name (`scheduler`, `server0`, `worker3`).
    pub name: String,
    /// `<name>.pem`.
    pub cert: String,
    /// `<name>.key`.
    pub key: String,
}

/// What the manifests are made of.
#[derive(Debug, Clone)]
pub struct KubeJob<'a> {
    /// The objects' name (a DNS-1035 label, see [`check_name`]).
    pub name: &'a str,
    /// The container image.
    pub image: &'a str,
    /// The workers' command (empty: the built-in job).
    pub command: &'a [String],
    /// The scheduler's UDP port.
    pub port: u16,
    /// The cluster file's text.
    pub cluster_toml: &'a str,
    /// The CA certificate (PEM).
    pub ca: &'a str,
    /// Every node, in completion-index order: the scheduler, the servers, the workers.
    pub nodes: &'a [NodeFiles],
}

/// Checks `--kubernetes NAME`: it names a Service, so a DNS-1035 label (lower-case letters,
/// digits and `-`, starting with a letter, not ending with `-`, at most 63 characters).
pub fn check_name(name: &str) -> CliResult<()> {
    let ok = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(CliError::usage(format!(
            "--kubernetes {name:?}: expected a DNS-1035 label (it names the Service): lower-case \
             letters, digits and '-', starting with a letter, not ending with '-', at most 63 \
             characters"
        )))
    }
}

/// Checks what `pushpull prepare --kubernetes` is given before it writes anything: the name
/// ([`check_name`]), `--image` (a non-empty reference without white space), and
/// `cluster.local_size` = 1 (every worker is a pod of its own, and a local group meets in one
/// network namespace: its sockets are abstract Unix sockets).
pub fn check(name: &str, image: &str, config: &Config) -> CliResult<()> {
    check_name(name)?;
    if image.is_empty() || image.contains(char::is_whitespace) {
        return Err(CliError::usage(format!(
            "--image {image:?}: expected an image reference, e.g. registry.example/pushpull:1"
        )));
    }
    let g = config.cluster.local_size;
    if g != 1 {
        return Err(CliError::usage(format!(
            "--kubernetes {name}: cluster.local_size = {g} (--local-size), but every worker is a \
             pod of its own and a local group's members must share one (their sockets are \
             abstract Unix sockets of one network namespace); use --local-size 1"
        )));
    }
    Ok(())
}

/// `cluster.scheduler` for the job `name`: `NAME:29500` without `--scheduler`, else
/// `scheduler` if it names the Service (`NAME:PORT`, `NAME.NAMESPACE:PORT`,
/// `NAME.NAMESPACE.svc:PORT`, ...: the first label is NAME). Another name or an IP address
/// is refused: only the Service's name follows the scheduler's pod.
pub fn scheduler_addr(name: &str, scheduler: Option<&str>) -> CliResult<String> {
    check_name(name)?;
    let Some(given) = scheduler else {
        return Ok(format!("{name}:{DEFAULT_PORT}"));
    };
    let addr = SchedulerAddr::parse(given)
        .map_err(|allowed| CliError::usage(format!("--scheduler {given:?}: {allowed}")))?;
    match &addr {
        SchedulerAddr::Name { host, .. } if host.split('.').next() == Some(name) => {
            Ok(addr.to_string())
        }
        _ => Err(CliError::usage(format!(
            "--scheduler {given:?}: with --kubernetes {name} the nodes reach the scheduler \
             through the Service {name}: give {name}:PORT (or {name}.NAMESPACE.svc:PORT), or \
             leave --scheduler out for {name}:{DEFAULT_PORT}"
        ))),
    }
}

impl KubeJob<'_> {
    /// The labels every object and pod carries.
    fn labels(&self) -> Value {
        json!({
            "app.kubernetes.io/name": "pushpull",
            "app.kubernetes.io/instance": self.name,
        })
    }

    fn metadata(&self, name: String) -> Value {
        json!({ "name": name, "labels": self.labels() })
    }

    /// The Secret's name.
    pub fn secret_name(&self) -> String {
        format!("{}-tls", self.name)
    }

    /// The ConfigMap with `cluster.toml`.
    pub fn config_map(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self.metadata(self.name.to_string()),
            "data": { "cluster.toml": self.cluster_toml },
        })
    }

    /// The Secret: `ca.pem`, and `<node>.pem` and `<node>.key` for every node.
    pub fn secret(&self) -> Value {
        let mut data = serde_json::Map::new();
        data.insert("ca.pem".into(), self.ca.into());
        for n in self.nodes {
            data.insert(format!("{}.pem", n.name), n.cert.clone().into());
            data.insert(format!("{}.key", n.name), n.key.clone().into());
        }
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": self.metadata(self.secret_name()),
            "type": "Opaque",
            "stringData": data,
        })
    }

    /// The headless Service whose name resolves to the scheduler's pod (index 0), even before
    /// the pod is ready.
    pub fn service(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.metadata(self.name.to_string()),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": true,
                "selector": {
                    "app.kubernetes.io/instance": self.name,
                    INDEX_KEY: "0",
                },
                "ports": [{ "name": "scheduler", "port": self.port, "protocol": "UDP" }],
            },
        })
    }

    /// The Secret volume's items: each node's three files under the folder of its index.
    pub fn tls_items(&self) -> Vec<Value> {
        self.nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| {
                [
                    "ca.pem".to_string(),
                    format!("{}.pem", n.name),
                    format!("{}.key", n.name),
                ]
                .map(|key| json!({ "key": key, "path": format!("{i}/{key}") }))
            })
            .collect()
    }

    /// The container's command: `pushpull node` of the pod's index, then the workers'
    /// command (with `$(` escaped, so Kubernetes leaves it as written).
    pub fn container_command(&self) -> Vec<String> {
        let mut c: Vec<String> = [
            "pushpull",
            "node",
            "--job-dir",
            POD_JOB_DIR,
            "--role",
            "auto",
            "--index",
            "$(INDEX)",
            "--tls-dir",
            POD_TLS_DIR,
        ]
        .map(String::from)
        .to_vec();
        if !self.command.is_empty() {
            c.push("--".into());
            c.extend(self.command.iter().map(|w| w.replace("$(", "$$(")));
        }
        c
    }

    /// The indexed Job: every node of the job, one pod per index; one failure fails it.
    pub fn job(&self) -> Value {
        let n = self.nodes.len();
        json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": self.metadata(self.name.to_string()),
            "spec": {
                "completionMode": "Indexed",
                "completions": n,
                "parallelism": n,
                "backoffLimit": 0,
                "template": {
                    "metadata": { "labels": self.labels() },
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{
                            "name": "node",
                            "image": self.image,
                            "command": self.container_command(),
                            "env": [{
                                "name": "INDEX",
                                "valueFrom": { "fieldRef": {
                                    "fieldPath": format!("metadata.annotations['{INDEX_KEY}']"),
                                }},
                            }],
                            "volumeMounts": [
                                { "name": "job", "mountPath": POD_JOB_DIR, "readOnly": true },
                                {
                                    "name": "tls",
                                    "mountPath": POD_TLS_DIR,
                                    "subPathExpr": "$(INDEX)",
                                    "readOnly": true,
                                },
                            ],
                        }],
                        "volumes": [
                            { "name": "job", "configMap": { "name": self.name } },
                            { "name": "tls", "secret": {
                                "secretName": self.secret_name(),
                                // 0400: the node warns about a key others may read.
                                "defaultMode": 0o400,
                                "items": self.tls_items(),
                            }},
                        ],
                    },
                },
            },
        })
    }

    /// Every object, in the order `kubectl apply` should create them.
    pub fn objects(&self) -> Vec<Value> {
        vec![self.config_map(), self.secret(), self.service(), self.job()]
    }

    /// The manifests as one YAML file: a comment, then the objects as JSON documents.
    pub fn to_yaml(&self) -> String {
        let mut text = format!(
            "# pushpull job {}: {} nodes, written by `pushpull prepare --kubernetes`.\n\
             # kubectl apply -f kubernetes.yaml; see deploy/k8s/README.md.\n",
            self.name,
            self.nodes.len()
        );
        let docs: Vec<String> = self
            .objects()
            .iter()
            .map(|o| serde_json::to_string_pretty(o).expect("JSON values serialise"))
            .collect();
        text.push_str(&docs.join("\n---\n"));
        text.push('\n');
        text
    }
}

fn read(path: &Path) -> CliResult<String> {
    std::fs::read_to_string(path)
        .map_err(|e| CliError::failed(format!("cannot read {}: {e}", path.display())))
}

/// Writes `out/kubernetes.yaml` for the job folder `out` (made by `pushpull prepare`): the
/// job `name` running `image`, its workers running `command`. Returns the text to print.
pub fn write(out: &Path, name: &str, image: &str, command: &[String]) -> CliResult<String> {
    let config = Config::from_file(out.join("cluster.toml")).map_err(CliError::usage)?;
    check(name, image, &config)?;
    let cluster_toml = read(&out.join("cluster.toml"))?;
    let port = config.scheduler_addr().port();
    let c = &config.cluster;
    let nodes = crate::certs::default_node_names(c.num_servers, c.num_workers)
        .into_iter()
        .map(|name| {
            let own = out.join(&name);
            Ok(NodeFiles {
                cert: read(&own.join(format!("{name}.pem")))?,
                key: read(&own.join(format!("{name}.key")))?,
                name,
            })
        })
        .collect::<CliResult<Vec<_>>>()?;
    let ca = read(&out.join("ca").join("ca.pem"))?;
    let size = ca.len()
        + nodes
            .iter()
            .map(|n| n.cert.len() + n.key.len())
            .sum::<usize>();
    if size > SECRET_LIMIT * 9 / 10 {
        return Err(CliError::usage(format!(
            "--kubernetes {name}: the certificates of {} nodes take {size} bytes, too close to a \
             Secret's 1 MiB; fewer --workers / --servers per job",
            nodes.len()
        )));
    }
    let job = KubeJob {
        name,
        image,
        command,
        port,
        cluster_toml: &cluster_toml,
        ca: &ca,
        nodes: &nodes,
    };
    let path = out.join("kubernetes.yaml");
    std::fs::write(&path, job.to_yaml())
        .map_err(|e| CliError::failed(format!("cannot write {}: {e}", path.display())))?;
    Ok(format!(
        "wrote {}: ConfigMap {name}, Secret {}, Service {name} (the scheduler, UDP {port}) and \
         the indexed Job {name} of {} pods running {image}; start it with `kubectl apply -f {}`",
        path.display(),
        job.secret_name(),
        nodes.len(),
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(servers: u32, workers: u32) -> Vec<NodeFiles> {
        crate::certs::default_node_names(servers, workers)
            .into_iter()
            .map(|name| NodeFiles {
                cert: format!("cert of {name}"),
                key: format!("key of {name}"),
                name,
            })
            .collect()
    }

    fn job<'a>(nodes: &'a [NodeFiles], command: &'a [String]) -> KubeJob<'a> {
        KubeJob {
            name: "pp",
            image: "pushpull:1",
            command,
            port: 29500,
            cluster_toml: "[cluster]\n",
            ca: "the ca",
            nodes,
        }
    }

    #[test]
    fn every_index_sees_exactly_its_nodes_three_files() {
        let nodes = nodes(2, 3);
        let j = job(&nodes, &[]);
        let items = j.tls_items();
        let secret = j.secret();
        let data = secret["stringData"].as_object().unwrap();
        assert_eq!(data.len(), 1 + 2 * nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            let mut mine: Vec<(String, String)> = items
                .iter()
                .filter(|it| it["path"].as_str().unwrap().starts_with(&format!("{i}/")))
                .map(|it| {
                    let key = it["key"].as_str().unwrap().to_string();
                    (key, it["path"].as_str().unwrap().to_string())
                })
                .collect();
            mine.sort();
            let name = &n.name;
            let want = [
                ("ca.pem".to_string(), format!("{i}/ca.pem")),
                (format!("{name}.key"), format!("{i}/{name}.key")),
                (format!("{name}.pem"), format!("{i}/{name}.pem")),
            ];
            assert_eq!(mine, want, "index {i}");
            assert_eq!(data[&format!("{name}.key")], n.key.as_str());
        }
        // Nothing else: three files per index, every key of the Secret used.
        assert_eq!(items.len(), 3 * nodes.len());
        // The pod mounts only its index's folder, the index from the downward API.
        let pod = &j.job()["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        let tls = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "tls")
            .unwrap();
        assert_eq!(tls["subPathExpr"], "$(INDEX)");
        assert_eq!(tls["mountPath"], POD_TLS_DIR);
        assert_eq!(
            c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
            format!("metadata.annotations['{INDEX_KEY}']")
        );
        assert_eq!(pod["volumes"][1]["secret"]["secretName"], "pp-tls");
        assert_eq!(pod["volumes"][1]["secret"]["defaultMode"], 0o400);
    }

    #[test]
    fn one_indexed_job_of_every_node_that_fails_at_the_first_failure() {
        let nodes = nodes(2, 3);
        let j = job(&nodes, &[]).job();
        let spec = &j["spec"];
        assert_eq!(spec["completionMode"], "Indexed");
        assert_eq!(spec["completions"], 6);
        assert_eq!(spec["parallelism"], 6);
        assert_eq!(spec["backoffLimit"], 0);
        assert_eq!(spec["template"]["spec"]["restartPolicy"], "Never");
        assert_eq!(
            spec["template"]["metadata"]["labels"]["app.kubernetes.io/instance"],
            "pp"
        );
        let cmd = &spec["template"]["spec"]["containers"][0]["command"];
        assert_eq!(
            cmd,
            &json!([
                "pushpull",
                "node",
                "--job-dir",
                "/job",
                "--role",
                "auto",
                "--index",
                "$(INDEX)",
                "--tls-dir",
                "/tls"
            ])
        );
    }

    #[test]
    fn the_service_resolves_to_index_0_on_the_schedulers_udp_port() {
        let nodes = nodes(1, 1);
        let s = job(&nodes, &[]).service();
        assert_eq!(s["metadata"]["name"], "pp");
        assert_eq!(s["spec"]["clusterIP"], "None");
        assert_eq!(s["spec"]["publishNotReadyAddresses"], true);
        assert_eq!(
            s["spec"]["selector"],
            json!({ "app.kubernetes.io/instance": "pp", INDEX_KEY: "0" })
        );
        assert_eq!(
            s["spec"]["ports"],
            json!([{ "name": "scheduler", "port": 29500, "protocol": "UDP" }])
        );
        // Index 0 is the scheduler in `--role auto`'s count.
        assert_eq!(nodes[0].name, "scheduler");
    }

    #[test]
    fn the_workers_command_follows_and_is_not_expanded() {
        let nodes = nodes(1, 1);
        let user = ["python", "train.py", "--tag", "$(HOME)"].map(String::from);
        let c = job(&nodes, &user).container_command();
        assert_eq!(
            c[c.len() - 5..],
            ["--", "python", "train.py", "--tag", "$$(HOME)"]
        );
    }

    #[test]
    fn the_file_is_four_json_documents() {
        let nodes = nodes(1, 2);
        let text = job(&nodes, &[]).to_yaml();
        let docs: Vec<Value> = text
            .split("\n---\n")
            .map(|d| {
                let json: String = d.lines().filter(|l| !l.starts_with('#')).collect();
                serde_json::from_str(&json).unwrap()
            })
            .collect();
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["ConfigMap", "Secret", "Service", "Job"]);
    }

    #[test]
    fn names_and_scheduler_addresses_are_checked() {
        assert_eq!(scheduler_addr("pp", None).unwrap(), "pp:29500");
        assert_eq!(scheduler_addr("pp", Some("pp:9000")).unwrap(), "pp:9000");
        assert_eq!(
            scheduler_addr("pp", Some("pp.ml.svc:9000")).unwrap(),
            "pp.ml.svc:9000"
        );
        for bad in ["node001:9000", "10.0.0.1:9000", "ppx:9000"] {
            let e = scheduler_addr("pp", Some(bad)).unwrap_err().to_string();
            assert!(e.contains("through the Service pp"), "{bad}: {e}");
        }
        let e = scheduler_addr("pp", Some("pp")).unwrap_err().to_string();
        assert!(e.contains("--scheduler \"pp\""), "{e}");
        for bad in ["", "Pp", "9pp", "pp-", "p_p", &"p".repeat(64)] {
            let e = check_name(bad).unwrap_err().to_string();
            assert!(e.contains("--kubernetes") && e.contains("DNS-1035"), "{e}");
        }
        check_name(&"p".repeat(63)).unwrap();
        let mut config = crate::local::default_config();
        config.cluster.local_size = 1;
        check("pp", "pushpull:1", &config).unwrap();
        let e = check("pp", "", &config).unwrap_err().to_string();
        assert!(e.contains("--image \"\""), "{e}");
        config.cluster.num_workers = 4;
        config.cluster.local_size = 2;
        let e = check("pp", "pushpull:1", &config).unwrap_err().to_string();
        assert!(e.contains("cluster.local_size = 2 (--local-size)"), "{e}");
    }
}

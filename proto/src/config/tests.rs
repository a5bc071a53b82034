//! Tests of the cluster file: parsing, validation errors that name the key, the digest.

use super::*;

const MINIMAL: &str = r#"
    [cluster]
    scheduler = "127.0.0.1:9000"
    num_workers = 2
    num_servers = 1
"#;

#[test]
fn minimal_file_gets_defaults() {
    let c = Config::from_toml_str(MINIMAL, "t.toml").unwrap();
    assert_eq!(c.cluster.partition_bytes, 131_072);
    assert_eq!(c.cluster.min_compress_bytes, 65_536);
    assert_eq!(c.cluster.max_chunk_payload_bytes, None);
    assert_eq!(c.cluster.chunk_payload_bound(), 32_768);
    // Unset, the bound follows the partition: a quarter, at least 1024.
    let mut big = c.clone();
    big.cluster.partition_bytes = 4_096_000;
    assert_eq!(big.cluster.chunk_payload_bound(), 1_024_000);
    big.cluster.partition_bytes = 400;
    assert_eq!(big.cluster.chunk_payload_bound(), 1024);
    assert_eq!(c.tls.server_name, "pushpull.cluster");
}

#[test]
fn unknown_key_is_named() {
    let text = format!("{MINIMAL}\nnum_wrokers = 3\n");
    let e = Config::from_toml_str(&text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("num_wrokers"), "{e}");
    assert!(e.contains("t.toml"), "{e}");
}

#[test]
fn missing_key_is_named() {
    let text = "[cluster]\nscheduler = \"127.0.0.1:1\"\nnum_workers = 1\n";
    let e = Config::from_toml_str(text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("num_servers"), "{e}");
}

#[test]
fn wrong_type_is_named() {
    let text = MINIMAL.replace("num_workers = 2", "num_workers = \"two\"");
    let e = Config::from_toml_str(&text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("num_workers"), "{e}");
}

#[test]
fn zero_workers_and_bad_address_are_refused() {
    let text = MINIMAL.replace("num_workers = 2", "num_workers = 0");
    let e = Config::from_toml_str(&text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cluster.num_workers") && e.contains("at least 1"),
        "{e}"
    );
    let text = MINIMAL.replace("127.0.0.1:9000", "localhost:x");
    let e = Config::from_toml_str(&text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cluster.scheduler") && e.contains("localhost:x"),
        "{e}"
    );
}

#[test]
fn the_scheduler_is_an_ip_address_or_a_dns_name() {
    use crate::config::SchedulerAddr;
    let ip = SchedulerAddr::parse("10.0.0.1:9000").unwrap();
    assert_eq!(ip, SchedulerAddr::Ip("10.0.0.1:9000".parse().unwrap()));
    assert_eq!(ip.bind_addr().to_string(), "10.0.0.1:9000");
    let v6 = SchedulerAddr::parse("[::1]:9000").unwrap();
    assert_eq!(v6.to_string(), "[::1]:9000");
    let name = SchedulerAddr::parse("Pushpull-0.pushpull.default.svc:29500").unwrap();
    assert_eq!(name.to_string(), "pushpull-0.pushpull.default.svc:29500");
    assert_eq!(name.port(), 29500);
    // A name: the scheduler binds every IPv4 address on the port.
    assert_eq!(name.bind_addr().to_string(), "0.0.0.0:29500");
    assert_eq!(
        SchedulerAddr::parse("node001.:0").unwrap().to_string(),
        "node001:0"
    );
    for bad in [
        "node001",
        "node_1:9000",
        "-node:9000",
        "node-:9000",
        "a..b:9000",
        ":9000",
        "node:99999",
        "10.0.0:9000",
        "::1:9000",
        &format!("{}:1", "a".repeat(64)),
    ] {
        let e = SchedulerAddr::parse(bad).unwrap_err();
        assert!(e.contains("DNS name"), "{bad}: {e}");
    }
    let text = MINIMAL.replace("127.0.0.1:9000", "sched.example:9000");
    let c = Config::from_toml_str(&text, "t.toml").unwrap();
    assert_eq!(c.scheduler_addr().port(), 9000);
}

#[test]
fn a_tiny_chunk_payload_bound_is_refused_naming_it() {
    let text = format!("{MINIMAL}max_chunk_payload_bytes = 100\n");
    let e = Config::from_toml_str(&text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cluster.max_chunk_payload_bytes") && e.contains("100") && e.contains("1024"),
        "{e}"
    );
    let ok = format!("{MINIMAL}max_chunk_payload_bytes = 1024\n");
    let c = Config::from_toml_str(&ok, "t.toml").unwrap();
    assert_eq!(c.cluster.chunk_payload_bound(), 1024);
    let mut d = c.clone();
    d.cluster.max_chunk_payload_bytes = Some(2048);
    let (key, _, _) = c.digest().first_difference(&d.digest()).unwrap();
    assert_eq!(key, "cluster.max_chunk_payload_bytes");
}

#[test]
fn worker_device_values() {
    for (device, ok) in [
        ("auto", true),
        ("cpu", true),
        ("cuda", true),
        ("cuda:3", true),
        ("cuda:", false),
        ("cuda:x", false),
        ("gpu", false),
    ] {
        let text = format!("{MINIMAL}\n[worker]\ndevice = {device:?}\n");
        match Config::from_toml_str(&text, "t.toml") {
            Ok(_) => assert!(ok, "{device} accepted"),
            Err(e) => {
                let e = e.to_string();
                assert!(!ok, "{device} refused: {e}");
                assert!(e.contains("worker.device") && e.contains("cuda:N"), "{e}");
            }
        }
    }
}

#[test]
fn tensor_tables_overlay_and_stringify() {
    let text = format!(
        "{MINIMAL}\n[tensors.default]\ncompressor = \"onebit\"\nscaling = true\n\
         [tensors.\"fc1.weight\"]\ncompressor = \"topk\"\nk = 0.01\n"
    );
    let c = Config::from_toml_str(&text, "t.toml").unwrap();
    let p = c.tensor_params("fc1.weight");
    assert_eq!(p["compressor"], "topk");
    assert_eq!(p["k"], "0.01");
    assert_eq!(p["scaling"], "true");
    assert_eq!(c.tensor_params("other")["compressor"], "onebit");
}

#[test]
fn send_window_and_udp_payload_are_checked() {
    let c = Config::from_toml_str(MINIMAL, "t.toml").unwrap();
    assert_eq!(c.cluster.send_window_bytes, 16 << 20);
    assert_eq!(c.cluster.max_udp_payload, 6500);
    for (line, key) in [
        ("send_window_bytes = 0", "cluster.send_window_bytes"),
        (
            "send_window_bytes = 2147483648",
            "cluster.send_window_bytes",
        ),
        ("max_udp_payload = 1199", "cluster.max_udp_payload"),
        ("max_udp_payload = 8952", "cluster.max_udp_payload"),
    ] {
        let text = MINIMAL.replace("num_servers = 1", &format!("num_servers = 1\n{line}"));
        let e = Config::from_toml_str(&text, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && e.contains("bytes"), "{line}: {e}");
    }
    // The key it replaced is named as unknown, with the keys that exist.
    let text = MINIMAL.replace(
        "num_servers = 1",
        "num_servers = 1\nmax_inflight_chunks = 4",
    );
    let e = Config::from_toml_str(&text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("max_inflight_chunks") && e.contains("send_window_bytes"),
        "{e}"
    );
}

#[test]
fn digest_names_the_first_difference() {
    let a = Config::from_toml_str(MINIMAL, "a").unwrap();
    let mut b = a.clone();
    b.cluster.partition_bytes = 1024;
    let (key, ours, theirs) = a.digest().first_difference(&b.digest()).unwrap();
    assert_eq!(key, "cluster.partition_bytes");
    assert_eq!(ours, "131072");
    assert_eq!(theirs, "1024");
    assert!(a.digest().first_difference(&a.digest()).is_none());
}

#[test]
fn local_groups_divide_the_workers() {
    let text = format!("{MINIMAL}local_size = 2\n");
    let c = Config::from_toml_str(
        &text.replace("num_workers = 2", "num_workers = 4"),
        "t.toml",
    );
    let c = c.unwrap();
    assert_eq!((c.cluster.local_size, c.cluster.num_hosts()), (2, 2));
    assert!(c.cluster.uses_servers());
    // One host: its reduction stays on the host unless forced through the servers.
    let mut one = c.clone();
    one.cluster.local_size = 4;
    assert!(!one.cluster.uses_servers());
    one.cluster.force_distributed = true;
    assert!(one.cluster.uses_servers());
    // Without local groups a single worker still goes through the servers.
    assert!(Config::local(1, 1).cluster.uses_servers());
    for bad in ["local_size = 3", "local_size = 0"] {
        let text = format!("{MINIMAL}{bad}\n").replace("num_workers = 2", "num_workers = 4");
        let e = Config::from_toml_str(&text, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cluster.local_size") && e.contains("divides"),
            "{e}"
        );
    }
    let mut d = c.clone();
    d.cluster.local_size = 1;
    let (key, _, _) = c.digest().first_difference(&d.digest()).unwrap();
    assert_eq!(key, "cluster.local_size");
}

#[test]
fn metrics_listen_is_optional_checked_and_not_compared() {
    let c = Config::from_toml_str(MINIMAL, "t.toml").unwrap();
    assert_eq!(c.metrics.listen, None);
    let text = format!("{MINIMAL}\n[metrics]\nlisten = \"127.0.0.1:0\"\n");
    let m = Config::from_toml_str(&text, "t.toml").unwrap();
    assert_eq!(m.metrics.listen.as_deref(), Some("127.0.0.1:0"));
    // It changes no result: nodes with and without it may join one cluster.
    assert!(c.digest().first_difference(&m.digest()).is_none());
    let bad = format!("{MINIMAL}\n[metrics]\nlisten = \"localhost\"\n");
    let e = Config::from_toml_str(&bad, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("metrics.listen") && e.contains("localhost"),
        "{e}"
    );
    let typo = format!("{MINIMAL}\n[metrics]\nlisen = \"127.0.0.1:0\"\n");
    let e = Config::from_toml_str(&typo, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("lisen"), "{e}");
}

#[test]
fn a_gossip_graph_is_checked_when_the_file_is_read() {
    let four = MINIMAL.replace("num_workers = 2", "num_workers = 4");
    let read =
        |gossip: &str| Config::from_toml_str(&format!("{four}\n[gossip]\n{gossip}\n"), "g.toml");
    let q = 0.25;
    // A ring of four with ¼ on each neighbour and ½ on itself is fine; the ring's default too.
    let good = format!(
        "mixing = [[0.5, {q}, 0, {q}], [{q}, 0.5, {q}, 0], [0, {q}, 0.5, {q}], [{q}, 0, {q}, 0.5]]"
    );
    let c = read(&good).unwrap();
    assert_eq!(
        c.gossip.matrix(4).unwrap().neighbours(0),
        vec![(1, q), (3, q)]
    );
    assert_ne!(
        c.digest(),
        Config::from_toml_str(&four, "g.toml").unwrap().digest()
    );
    // The graph: each worker's neighbours and weights; none with local groups.
    assert_eq!(c.gossip.graph(&c.cluster).unwrap()[2], vec![(1, q), (3, q)]);
    let mut grouped = c.cluster.clone();
    grouped.local_size = 2;
    let e = c.gossip.graph(&grouped).unwrap_err();
    assert!(e.contains("cluster.local_size is 2"), "{e}");
    let cases = [
        // A ring of four with ½ to each neighbour and nothing on itself is bipartite.
        (
            "mixing = [[0, 0.5, 0, 0.5], [0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5], [0.5, 0, 0.5, 0]]",
            "eigenvalue",
        ),
        ("mixing = [[1.0]]", "one row per worker"),
        (
            "mixing = [[0.5, 0.5, 0, 0], [0.25, 0.5, 0.25, 0], [0, 0.25, 0.5, 0.25], [0.25, 0, 0.25, 0.5]]",
            "symmetric",
        ),
        ("gamma = 0", "0 < gamma <= 1"),
        ("gamma = 1.5", "0 < gamma <= 1"),
        ("mixing = 3", "mixing"),
        ("graph = \"ring\"", "graph"),
    ];
    for (text, want) in cases {
        let e = read(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}: {e}");
        let key = text.split(' ').next().unwrap();
        assert!(e.contains(key), "{text}: the error names {key}: {e}");
    }
}

#[test]
fn trace_keys_are_optional_checked_and_not_compared() {
    let c = Config::from_toml_str(MINIMAL, "t.toml").unwrap();
    assert_eq!(c.trace, TraceConfig::default());
    assert!(c.trace.is_off());
    let text = format!("{MINIMAL}\n[trace]\ndir = \"/tmp/tl\"\nstart_step = 3\nend_step = 5\n");
    let t = Config::from_toml_str(&text, "t.toml").unwrap();
    assert_eq!(t.trace.dir.as_deref(), Some("/tmp/tl"));
    assert_eq!((t.trace.start_step, t.trace.end_step), (3, Some(5)));
    // It changes no result: nodes with and without it may join one cluster.
    assert!(c.digest().first_difference(&t.digest()).is_none());
    for (bad, key) in [
        ("start_step = 0", "trace.start_step"),
        ("start_step = 4\nend_step = 3", "trace.end_step"),
        ("dir = \"\"", "trace.dir"),
        ("stop_step = 3", "stop_step"),
    ] {
        let text = format!("{MINIMAL}\n[trace]\n{bad}\n");
        let e = Config::from_toml_str(&text, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{bad}: {e}");
    }
}
